//! The secrets this server knows: each secret ARN names MariaDB credentials (a username
//! and a password), as a Secrets Manager secret does for the real Data API. A call signs
//! in to MariaDB as the user of the secret it carries; an unknown secret is refused.
//!
//! The secret of `--secret-arn` holds the user of the MySQL URL (the master user);
//! more come from a secrets file (`--secrets-file`), one secret per line:
//!
//! ```text
//! # ARN                                                          username     password
//! arn:aws:secretsmanager:us-east-1:000000000000:secret:app       seckill_app  Xy12...
//! # ARN                                                          secret string
//! arn:aws:secretsmanager:us-east-1:000000000000:secret:webhook   whsec_ab12...
//! ```
//!
//! A line of two words is a plain secret (the payment webhook's signing secrets):
//! GetSecretValue answers its string as it is, and no Data API call may sign in with
//! it.
//!
//! The file holds passwords, so it must be readable by its owner only (mode 0600 or
//! stricter); passwords never go on a command line.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context as _, bail};

use crate::lock::lock;

/// A secret's ARN and the MariaDB credentials it holds, or, with an empty `username`, a
/// plain secret whose string is `password`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SecretCredentials {
    pub arn: String,
    pub username: String,
    pub password: String,
}

impl SecretCredentials {
    /// A plain secret (a string, no database user).
    pub fn is_plain(&self) -> bool {
        self.username.is_empty()
    }
}

impl std::fmt::Debug for SecretCredentials {
    // Never print the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretCredentials")
            .field("arn", &self.arn)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Reads a secrets file (see the module header). Refuses a file others can read.
pub fn read_secrets_file(path: &Path) -> anyhow::Result<Vec<SecretCredentials>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            bail!(
                "{} holds passwords and is readable by others (mode {:o}): chmod 600 it",
                path.display(),
                mode & 0o777
            );
        }
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_secrets(&text).with_context(|| format!("in {}", path.display()))
}

/// The lines of a secrets file.
pub fn parse_secrets(text: &str) -> anyhow::Result<Vec<SecretCredentials>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (arn, username, password) = match words.as_slice() {
            [arn, username, password] => (*arn, *username, *password),
            [arn, string] => (*arn, "", *string),
            _ => bail!(
                "line {}: expected `ARN USERNAME PASSWORD` or `ARN STRING`, found {} words",
                n + 1,
                words.len()
            ),
        };
        if !arn.starts_with("arn:") {
            bail!("line {}: {arn} is not an ARN", n + 1);
        }
        out.push(SecretCredentials {
            arn: arn.to_string(),
            username: username.to_string(),
            password: password.to_string(),
        });
    }
    Ok(out)
}

/// Secret ARN → credentials, changeable while the server runs (a rotation).
pub struct SecretStore(Mutex<BTreeMap<String, SecretCredentials>>);

impl SecretStore {
    /// Refuses an ARN given twice.
    pub fn new(secrets: impl IntoIterator<Item = SecretCredentials>) -> anyhow::Result<Self> {
        let mut by_arn = BTreeMap::new();
        for secret in secrets {
            let arn = secret.arn.clone();
            if by_arn.insert(arn.clone(), secret).is_some() {
                bail!("the secret {arn} is configured twice");
            }
        }
        Ok(SecretStore(Mutex::new(by_arn)))
    }

    /// The credentials of a secret, `None` when it is unknown.
    pub fn get(&self, arn: &str) -> Option<SecretCredentials> {
        lock(&self.0).get(arn).cloned()
    }

    /// Adds a secret or replaces its credentials.
    pub fn set(&self, secret: SecretCredentials) {
        lock(&self.0).insert(secret.arn.clone(), secret);
    }

    /// The known ARNs, sorted (for messages).
    pub fn arns(&self) -> Vec<String> {
        lock(&self.0).keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_file_lines() {
        let s = parse_secrets("# comment\n\narn:aws:x:app  seckill_app  Pw1\n").unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].arn, "arn:aws:x:app");
        assert_eq!(s[0].username, "seckill_app");
        assert_eq!(s[0].password, "Pw1");
        let plain = parse_secrets("arn:aws:x:webhook whsec_1,whsec_0").unwrap();
        assert!(plain[0].is_plain());
        assert_eq!(plain[0].password, "whsec_1,whsec_0");
        assert!(!s[0].is_plain());
        assert!(parse_secrets("arn:aws:x:app seckill_app pw extra").is_err());
        assert!(parse_secrets("app seckill_app pw").is_err());
        assert!(!format!("{:?}", s[0]).contains("Pw1"));
    }
}
