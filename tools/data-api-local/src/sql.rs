//! Turns Data API SQL with `:name` placeholders into MySQL `?` placeholders plus the
//! ordered list of names, so values are bound as real prepared-statement parameters and
//! never spliced into SQL text.
//!
//! mysql_common's own named-parameter parser only accepts lower-case names, while Data
//! API callers use any identifier (`:userId`), hence this scanner. It skips string
//! literals (with backslash escapes and doubled quotes), back-quoted identifiers and
//! comments, so a `:word` inside them stays text. A name may appear several times.

use crate::error::ApiError;

/// The SQL as MariaDB will prepare it and the parameter name for each `?`, in order.
#[derive(Debug)]
pub struct PlaceholderSql {
    pub sql: String,
    pub names: Vec<String>,
}

/// The Data API has no positional parameters; a `?` would shift every binding.
const POSITIONAL: &str =
    "Positional '?' placeholders are not supported by the Data API; use :name placeholders";

#[derive(Clone, Copy)]
enum State {
    Code,
    Quoted(char),
    QuotedEscape(char),
    Backtick,
    LineComment,
    BlockComment,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

pub fn parse(sql: &str) -> Result<PlaceholderSql, ApiError> {
    let mut out = String::with_capacity(sql.len());
    let mut names = Vec::new();
    let mut state = State::Code;
    let mut chars = sql.char_indices().peekable();

    while let Some((i, c)) = chars.next() {
        match state {
            State::Code => match c {
                '\'' | '"' => state = State::Quoted(c),
                '`' => state = State::Backtick,
                '#' => state = State::LineComment,
                // MySQL needs whitespace (or the end) after `--` for a comment.
                '-' if sql[i..].starts_with("--")
                    && sql[i + 2..].chars().next().is_none_or(char::is_whitespace) =>
                {
                    state = State::LineComment
                }
                // `/*!` (versioned code) and `/*+` (optimizer hints) are read by the
                // server as code, so they stay in the code state like mysql_common does.
                '/' if sql[i..].starts_with("/*")
                    && !sql[i..].starts_with("/*!")
                    && !sql[i..].starts_with("/*+") =>
                {
                    out.push_str("/*");
                    chars.next();
                    state = State::BlockComment;
                    continue;
                }
                '?' => return Err(ApiError::bad_request(POSITIONAL)),
                ':' => {
                    if let Some(&(start, next)) = chars.peek()
                        && is_name_start(next)
                    {
                        let mut end = start;
                        while let Some(&(j, n)) = chars.peek() {
                            if !is_name_char(n) {
                                break;
                            }
                            end = j + n.len_utf8();
                            chars.next();
                        }
                        names.push(sql[start..end].to_string());
                        out.push('?');
                        continue;
                    }
                }
                _ => {}
            },
            State::Quoted(q) => {
                if c == '\\' {
                    state = State::QuotedEscape(q);
                } else if c == q {
                    // A doubled quote ('') closes and reopens: same result.
                    state = State::Code;
                }
            }
            State::QuotedEscape(q) => state = State::Quoted(q),
            State::Backtick => {
                if c == '`' {
                    state = State::Code;
                }
            }
            State::LineComment => {
                if c == '\n' {
                    state = State::Code;
                }
            }
            State::BlockComment => {
                if c == '*' && sql[i..].starts_with("*/") {
                    out.push_str("*/");
                    chars.next();
                    state = State::Code;
                    continue;
                }
            }
        }
        out.push(c);
    }
    Ok(PlaceholderSql { sql: out, names })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sql: &str) -> (String, Vec<String>) {
        let parsed = parse(sql).unwrap();
        (parsed.sql, parsed.names)
    }

    #[test]
    fn replaces_names_in_order_and_repeats() {
        let (sql, found) = names("UPDATE t SET a = :userId, b = :b_2 WHERE id = :userId");
        assert_eq!(sql, "UPDATE t SET a = ?, b = ? WHERE id = ?");
        assert_eq!(found, vec!["userId", "b_2", "userId"]);
    }

    #[test]
    fn leaves_literals_identifiers_and_comments_alone() {
        let sql = "SELECT ':a', \"x:b\", 'it''s :c', 'esc\\' :d', `col:e`, :f -- :g\n, :h # :i\n/* :j */ :k";
        let (out, found) = names(sql);
        assert_eq!(found, vec!["f", "h", "k"]);
        assert_eq!(
            out,
            "SELECT ':a', \"x:b\", 'it''s :c', 'esc\\' :d', `col:e`, ? -- :g\n, ? # :i\n/* :j */ ?"
        );
    }

    #[test]
    fn colon_not_followed_by_a_name_is_text() {
        let (sql, found) = names("SELECT @a := 1, '10:30', :9");
        assert_eq!(sql, "SELECT @a := 1, '10:30', :9");
        assert!(found.is_empty());
        // `--x` is not a comment in MySQL: it is minus minus x.
        assert_eq!(names("SELECT 1--:a").1, vec!["a"]);
    }

    #[test]
    fn rejects_positional_placeholders_outside_literals() {
        assert_eq!(parse("SELECT ?").unwrap_err().to_string(), POSITIONAL);
        assert!(parse("SELECT '?'").is_ok());
    }
}
