//! The repository as a newcomer reads it: comments and documents speak of the code as it
//! is, not of a tracker that is not in the repository. History lives in git.

use std::process::Command;

use seckill_tests::stack::workspace_root;

/// No file cites an issue by number (`issue #16`, `(#16)`). Applied migrations are the
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
