//! The repository as a newcomer reads it: comments and documents speak of the code as it
//! is, not of a tracker that is not in the repository (history lives in git); the README
//! is short, its two commands come first, and the configuration table is the code's.

use std::process::Command;

use seckill_tests::stack::workspace_root;

/// No file cites an issue by number (`issue #` or `(#` and digits). Applied migrations are the
/// one exception: each is checksummed by the databases that ran it, so its text never
/// changes.
#[test]
fn no_file_cites_an_issue_number() {
    let root = workspace_root();
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let cite = regex_lite(&["issue #", "issues #", "Issue #", "(#"]);
    let mut found = Vec::new();
    let mut files = 0;
    for path in out.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let path = String::from_utf8_lossy(path).into_owned();
        if path.starts_with("migrations/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&path)) else {
            continue; // binary
        };
        files += 1;
        for (n, line) in text.lines().enumerate() {
            if cite(line) {
                found.push(format!("{path}:{}: {line}", n + 1));
            }
        }
    }
    assert!(files > 100, "only {files} files read");
    assert!(
        found.is_empty(),
        "issue numbers cited:\n{}",
        found.join("\n")
    );
}

/// A matcher for any `prefix` followed by a digit.
fn regex_lite(prefixes: &'static [&'static str]) -> impl Fn(&str) -> bool {
    move |line: &str| {
        prefixes.iter().any(|p| {
            line.match_indices(p).any(|(i, _)| {
                line[i + p.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
        })
    }
}

/// The README is read in minutes: at most 250 lines, the two commands within its first
/// 30, and every test it cites as proof of a promise exists.
#[test]
fn the_readme_is_short_starts_with_the_two_commands_and_cites_real_tests() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 250, "README.md has {} lines", lines.len());
    for command in ["scripts/demo.sh", "scripts/test.sh"] {
        let at = lines.iter().position(|l| l.starts_with(command));
        assert!(
            at.is_some_and(|i| i < 30),
            "{command} is not within the first 30 lines"
        );
    }
    // `suite::test_name` citations: the suite's file has that test.
    let mut cited = 0;
    for word in readme.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        let Some((suite, name)) = word.split_once("::") else {
            continue;
        };
        if name.contains("::") || name.len() < 12 || suite.is_empty() {
            continue;
        }
        let file = root.join(format!("tests/tests/it/{suite}.rs"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|_| panic!("README cites {word}, but there is no suite {suite}"));
        assert!(
            text.contains(&format!("fn {name}(")),
            "README cites {word}, which does not exist"
        );
        cited += 1;
    }
    assert!(cited >= 7, "the promises cite only {cited} tests");
}

/// docs/configuration.md's table names exactly the variables the functions read
/// (`config::env_vars()` of both, plus the logging and metrics switches).
#[test]
fn the_configuration_table_is_exactly_what_the_functions_read() {
    let root = workspace_root();
    let doc =
        std::fs::read_to_string(root.join("docs/configuration.md")).expect("docs/configuration.md");
    let mut in_doc = std::collections::BTreeSet::new();
    for line in doc
        .lines()
        .skip_while(|l| !l.starts_with("| variable |"))
        .skip(2)
    {
        let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            break;
        };
        for name in first.split('`').skip(1).step_by(2) {
            in_doc.insert(name.to_string());
        }
    }
    let mut read: std::collections::BTreeSet<String> = seckill_http::config::env_vars()
        .into_iter()
        .chain(order_drainer::config::env_vars())
        .map(str::to_string)
        .collect();
    read.extend(["RUST_LOG".to_string(), "SECKILL_METRICS".to_string()]);
    assert_eq!(in_doc, read, "docs/configuration.md against the code");
}
