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

/// The source files of the workspace's crates (`<crate>/src/**.rs`), as paths relative
/// to the root, tracked by git.
fn crate_sources() -> Vec<String> {
    let root = workspace_root();
    let out = Command::new("git")
        .args(["ls-files", "-z", "--", "*.rs"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    out.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .filter(|p| p.contains("/src/") || p.starts_with("src/"))
        .collect()
}

/// No source file is over 600 lines, tests apart (the `tests` crate, and a module's unit
/// tests kept in a `tests.rs` of their own).
#[test]
fn no_source_file_is_over_600_lines() {
    let root = workspace_root();
    let mut big = Vec::new();
    let files = crate_sources();
    for path in &files {
        if path.starts_with("tests/") || path.ends_with("/tests.rs") {
            continue;
        }
        let lines = std::fs::read_to_string(root.join(path))
            .expect("source")
            .lines()
            .count();
        if lines > 600 {
            big.push(format!("{path}: {lines} lines"));
        }
    }
    assert!(files.len() > 50, "only {} sources found", files.len());
    assert!(big.is_empty(), "files over 600 lines:\n{}", big.join("\n"));
}

/// No import circles: within each crate, the files' `use` graph (a file naming
/// `crate::a::b`, `super::b` or a child `b::` depends on the file that defines that
/// module) has no cycle, so every crate reads in layers.
#[test]
fn no_crate_has_an_import_circle() {
    let root = workspace_root();
    let mut crates: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for path in crate_sources() {
        let (krate, _) = path.split_once("/src/").unwrap_or(("", &path));
        crates.entry(krate.to_string()).or_default().push(path);
    }
    let mut circles = Vec::new();
    for (krate, files) in &crates {
        let src = if krate.is_empty() {
            "src/".to_string()
        } else {
            format!("{krate}/src/")
        };
        let has_lib = files.iter().any(|f| f == &format!("{src}lib.rs"));
        let mut modules: std::collections::BTreeMap<Vec<String>, String> = Default::default();
        for f in files {
            let rel = f[src.len()..].trim_end_matches(".rs");
            if rel == "main" && has_lib || rel.starts_with("bin/") {
                continue; // a binary of its own, using the library by name
            }
            let mut m: Vec<String> = rel.split('/').map(str::to_string).collect();
            if matches!(m.last().map(String::as_str), Some("lib" | "main" | "mod")) {
                m.pop();
            }
            modules.insert(m, f.clone());
        }
        let graph: std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>> = modules
            .iter()
            .map(|(m, f)| {
                let text = std::fs::read_to_string(root.join(f)).expect("source");
                (m.clone(), uses(m, &text, &modules))
            })
            .collect();
        for circle in cycles(&graph) {
            let names: Vec<String> = circle.iter().map(|m| modules[m].clone()).collect();
            circles.push(names.join(" <-> "));
        }
    }
    assert!(crates.len() >= 7, "only {} crates found", crates.len());
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The modules of `modules` that module `me` (whose text is `text`) refers to.
fn uses(
    me: &[String],
    text: &str,
    modules: &std::collections::BTreeMap<Vec<String>, String>,
) -> Vec<Vec<String>> {
    // Unit tests may use anything; comments name things without using them.
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| modules.contains_key(p))
    };
    let ident = |s: &str| -> (String, usize) {
        let n = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        (s[..n].to_string(), n)
    };
    // How many inline modules (`mod x { ... }`) enclose each byte: in one, `super` is
    // this file itself.
    let mut inline = vec![0u8; code.len() + 1];
    {
        let (mut depth, mut opens) = (0usize, Vec::new());
        let mut pending = false;
        for (k, c) in code.char_indices() {
            match c {
                '{' => {
                    depth += 1;
                    if pending {
                        opens.push(depth);
                        pending = false;
                    }
                }
                '}' => {
                    if opens.last() == Some(&depth) {
                        opens.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                ';' => pending = false,
                'm' if code[k..].starts_with("mod ")
                    && (k == 0 || !code.as_bytes()[k - 1].is_ascii_alphanumeric()) =>
                {
                    pending = true;
                }
                _ => {}
            }
            for b in &mut inline[k..k + c.len_utf8()] {
                *b = opens.len().min(255) as u8;
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let after_colons = i >= 2 && &bytes[i - 2..i] == b"::";
        if !at_word || after_colons || !bytes[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let (first, n) = ident(&code[i..]);
        let mut j = i + n;
        if !code[j..].starts_with("::") {
            i = j.max(i + 1);
            continue;
        }
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "super" if inline[i] > 0 => me.to_vec(),
            "super" => me[..me.len().saturating_sub(1)].to_vec(),
            "self" => me.to_vec(),
            child => {
                // A child module named by a relative path.
                let mut m = me.to_vec();
                m.push(child.to_string());
                if modules.contains_key(&m) {
                    out.insert(m);
                }
                i = j;
                continue;
            }
        };
        // The path's segments, and one level of a `{a::b, c}` group.
        while code[j..].starts_with("::") {
            j += 2;
            if code[j..].starts_with('{') {
                // The group's end, and its parts at the top level (a nested group is
                // taken at its prefix: a module, or an item of one).
                let (mut depth, mut end, mut parts, mut part) =
                    (0, code.len(), Vec::new(), String::new());
                for (k, c) in code[j..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        end = j + k;
                        break;
                    }
                    if depth == 1 && c == ',' {
                        parts.push(std::mem::take(&mut part));
                    } else if !(depth == 1 && c == '{') {
                        part.push(c);
                    }
                }
                parts.push(part);
                for part in parts {
                    let prefix = part.split('{').next().unwrap_or("");
                    let segs: Vec<String> = prefix
                        .trim()
                        .split("::")
                        .map(|s| ident(s.trim()).0)
                        .filter(|s| !s.is_empty())
                        .collect();
                    let mut p = base.clone();
                    p.extend(segs);
                    out.extend(resolve(&p));
                }
                j = end;
                base.clear();
                base.push("\u{0}".into());
                break;
            }
            let (seg, n) = ident(&code[j..]);
            if seg.is_empty() {
                break;
            }
            if seg == "super" {
                base.pop();
            } else {
                base.push(seg);
            }
            j += n;
        }
        if base.first().map(String::as_str) != Some("\u{0}") {
            out.extend(resolve(&base));
        }
        i = j.max(i + 1);
    }
    out.remove(me);
    out.into_iter().collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(
    graph: &std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        graph: &'a std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>>,
        index: std::collections::HashMap<&'a Vec<String>, (usize, usize)>,
        stack: Vec<&'a Vec<String>>,
        on_stack: std::collections::HashSet<&'a Vec<String>>,
        next: usize,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let Some((w, _)) = graph.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.index[v].1.min(s.index[w].1);
                s.index.get_mut(v).unwrap().1 = low;
            } else if s.on_stack.contains(w) {
                let low = s.index[v].1.min(s.index[w].0);
                s.index.get_mut(v).unwrap().1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.found.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: Default::default(),
        stack: Vec::new(),
        on_stack: Default::default(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let mut modules = std::collections::BTreeMap::new();
    for m in [vec![], vec!["a".to_string()], vec!["b".to_string()]] {
        modules.insert(m, String::new());
    }
    let a = uses(&["a".to_string()], "use crate::b::Thing;\n", &modules);
    let b = uses(
        &["b".to_string()],
        "use crate::{a::{f, g}, b};\nfn g() { super::a::h() }",
        &modules,
    );
    assert_eq!(a, vec![vec!["b".to_string()]]);
    assert_eq!(b, vec![vec!["a".to_string()]]);
    let graph = [(vec!["a".to_string()], a), (vec!["b".to_string()], b)]
        .into_iter()
        .collect();
    assert_eq!(cycles(&graph).len(), 1);
    let none = uses(
        &["a".to_string()],
        "// use crate::b;\nuse std::b::x;\n",
        &modules,
    );
    assert!(none.is_empty(), "{none:?}");
    // `super` inside an inline module is the file itself, not its parent.
    let inline = uses(
        &["a".to_string()],
        "pub mod param {\n    use super::*;\n}\nfn f() { super::b::g() }",
        &modules,
    );
    assert_eq!(inline, vec![vec!["b".to_string()]]);
    let parent = uses(&["a".to_string()], "use super::Thing;\n", &modules);
    assert_eq!(parent, vec![Vec::<String>::new()]);
}
