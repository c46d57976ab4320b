//! Schema migrations, applied through the RDS Data API.
//!
//! The same runner serves the local stack, the tests (a fresh database each) and AWS
//! (`seckill migrate` against the Aurora cluster), so there is one path to the schema.
//! Migrations are the files `migrations/NNNN_name.sql`, embedded at build time so the
//! binary carries them. Each version is applied once and recorded with a checksum in
//! `schema_migrations`; an edited, already-applied file is an error, not a silent skip.
//! MySQL commits DDL implicitly, so statements are written to be re-runnable
//! (`IF NOT EXISTS`), which makes a run interrupted half-way safe to repeat.
//!
//! [`ensure_app_user`] then makes the functions' database user (docs/security.md): a user of its own with only the statements the functions run, SELECT,
//! INSERT and UPDATE on `vouchers` and `orders` (the drainer's `SELECT ... FOR UPDATE`
//! needs nothing more), with the password of its own secret. Migrations run with the
//! master secret, the functions with the application user's.

use sha2::{Digest, Sha256};

use crate::adapters::data_api::{DataApi, field, param};
use crate::error::StoreError;

/// One migration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    pub version: u32,
    pub name: String,
    pub sql: &'static str,
}

impl Migration {
    pub fn checksum(&self) -> String {
        Sha256::digest(self.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The statements of the file, in order.
    pub fn statements(&self) -> Vec<String> {
        split_statements(self.sql)
    }
}

/// The migrations of this build, in version order.
pub fn embedded() -> Vec<Migration> {
    EMBEDDED
        .iter()
        .map(|(file, sql)| {
            let (version, name) = file
                .trim_end_matches(".sql")
                .split_once('_')
                .unwrap_or((file, ""));
            Migration {
                version: version.parse().unwrap_or(0),
                name: name.to_string(),
                sql,
            }
        })
        .collect()
}

/// Every file of `migrations/`. A test checks this list against the folder.
pub const EMBEDDED: &[(&str, &str)] = &[
    (
        "0001_schema.sql",
        include_str!("../../migrations/0001_schema.sql"),
    ),
    (
        "0002_voucher_delete_guard.sql",
        include_str!("../../migrations/0002_voucher_delete_guard.sql"),
    ),
    (
        "0003_user_id_binary.sql",
        include_str!("../../migrations/0003_user_id_binary.sql"),
    ),
    (
        "0004_order_payment.sql",
        include_str!("../../migrations/0004_order_payment.sql"),
    ),
    (
        "0005_voucher_buckets.sql",
        include_str!("../../migrations/0005_voucher_buckets.sql"),
    ),
    (
        "0006_payments.sql",
        include_str!("../../migrations/0006_payments.sql"),
    ),
    (
        "0007_waiting_room.sql",
        include_str!("../../migrations/0007_waiting_room.sql"),
    ),
    (
        "0008_unmatched_payments.sql",
        include_str!("../../migrations/0008_unmatched_payments.sql"),
    ),
    (
        "0009_checkouts.sql",
        include_str!("../../migrations/0009_checkouts.sql"),
    ),
    (
        "0010_refunds.sql",
        include_str!("../../migrations/0010_refunds.sql"),
    ),
    (
        "0011_queue_positions.sql",
        include_str!("../../migrations/0011_queue_positions.sql"),
    ),
    (
        "0012_rebuy_limit.sql",
        include_str!("../../migrations/0012_rebuy_limit.sql"),
    ),
    (
        "0013_order_events.sql",
        include_str!("../../migrations/0013_order_events.sql"),
    ),
];

/// Splits SQL text into statements at the delimiter (`;`) outside quotes and comments;
/// drops comments and empty statements.
///
/// A line `DELIMITER <text>` between statements changes the delimiter, as in the mysql
/// client, so a statement whose body holds `;` (a trigger's `BEGIN ... END`) stays
/// whole: `DELIMITER //`, the statement ending in `//`, then `DELIMITER ;`. The
/// directive itself is not a statement.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut delimiter = ";".to_string();
    let mut quote: Option<char> = None;
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if let Some(q) = quote {
            let mut len = c.len_utf8();
            if c == '\\' {
                len += rest[len..].chars().next().map_or(0, char::len_utf8);
            } else if c == q {
                quote = None;
            }
            cur.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        if cur.trim().is_empty() {
            let line_start = rest.trim_start_matches([' ', '\t', '\r', '\n']);
            let word = line_start.get(..10);
            if word.is_some_and(|w| w.eq_ignore_ascii_case("DELIMITER ")) {
                let end = line_start.find('\n').unwrap_or(line_start.len());
                let new = line_start[10..end].trim();
                if !new.is_empty() {
                    delimiter = new.to_string();
                }
                cur.clear();
                rest = &line_start[end..];
                continue;
            }
        }
        if rest.starts_with(delimiter.as_str()) {
            if !cur.trim().is_empty() {
                out.push(cur.trim().to_string());
            }
            cur.clear();
            rest = &rest[delimiter.len()..];
            continue;
        }
        if rest.starts_with("--") || c == '#' {
            // A comment runs to the end of the line; the newline stays.
            let end = rest.find('\n').unwrap_or(rest.len());
            rest = &rest[end..];
            continue;
        }
        if matches!(c, '\'' | '"' | '`') {
            quote = Some(c);
        }
        cur.push(c);
        rest = &rest[c.len_utf8()..];
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A migration problem.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The application user's secret or name cannot be used (see [`AppUser::parse`]).
    #[error("application user: {0}")]
    AppUser(String),
    #[error(
        "migration {version} was changed after it was applied (checksum {applied} in the database, {file} in this build)"
    )]
    Edited {
        version: u32,
        applied: String,
        file: String,
    },
}

/// Applies the pending migrations; returns the versions applied now.
pub async fn apply(db: &DataApi, migrations: &[Migration]) -> Result<Vec<u32>, MigrateError> {
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (\
           version INT UNSIGNED NOT NULL PRIMARY KEY, \
           name VARCHAR(200) NOT NULL, \
           checksum CHAR(64) NOT NULL, \
           applied_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))",
        vec![],
        None,
    )
    .await?;
    let out = db
        .execute(
            "SELECT version, checksum FROM schema_migrations",
            vec![],
            None,
        )
        .await?;
    let applied: Vec<(u32, String)> = out
        .records()
        .iter()
        .filter_map(|r| Some((field::long(r.first()?)? as u32, field::string(r.get(1)?)?)))
        .collect();
    let mut done = Vec::new();
    for m in migrations {
        if let Some((_, sum)) = applied.iter().find(|(v, _)| *v == m.version) {
            if *sum != m.checksum() {
                return Err(MigrateError::Edited {
                    version: m.version,
                    applied: sum.clone(),
                    file: m.checksum(),
                });
            }
            continue;
        }
        for statement in m.statements() {
            match db.execute(&statement, vec![], None).await {
                Ok(_) => {}
                // A file that stopped part-way (a timeout, a crash) or ran twice at once:
                // an ALTER is atomic, so "already there / already gone" means this
                // statement was applied before.
                Err(StoreError::Database(message)) if already_applied(&message) => {
                    tracing::warn!(version = m.version, %message, "statement already applied; going on");
                }
                Err(e) => return Err(e.into()),
            }
        }
        // INSERT IGNORE: a concurrent runner that applied the same (idempotent) file
        // first is not an error.
        db.execute(
            "INSERT IGNORE INTO schema_migrations (version, name, checksum) VALUES (:version, :name, :checksum)",
            vec![param::long("version", m.version.into()), param::string("name", &m.name), param::string("checksum", &m.checksum())],
            None,
        )
        .await?;
        tracing::info!(version = m.version, name = %m.name, "migration applied");
        done.push(m.version);
    }
    Ok(done)
}

/// Whether a DDL error says the statement's change is already in place (MariaDB and
/// MySQL 8 wording): a duplicate column, key or check constraint, or a key to drop
/// that is gone.
fn already_applied(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "duplicate column name",
        "duplicate key name",
        "duplicate check constraint name",
        "check that column/key exists",
        "check that it exists",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// The tables the functions use and the statements they run on them: all the
/// application user is granted.
pub const APP_GRANTS: &[(&str, &str)] = &[
    ("vouchers", "SELECT, INSERT, UPDATE"),
    ("orders", "SELECT, INSERT, UPDATE"),
    ("payments", "SELECT, INSERT, UPDATE"),
    ("checkouts", "SELECT, INSERT"),
    ("queue_positions", "SELECT, INSERT"),
    // The drainer publishes the order events the triggers write, then deletes them.
    ("order_events", "SELECT, DELETE"),
];

/// The application user, from its secret. The name and password are written into
/// `CREATE USER` / `ALTER USER` (MySQL binds no parameters there), so both are limited
/// to characters that need no quoting: the name `[A-Za-z0-9_]{1,32}`, the password
/// letters and digits only (8 to 128 of them; the template's secret excludes
/// punctuation for this reason).
#[derive(Clone, PartialEq, Eq)]
pub struct AppUser {
    pub username: String,
    password: String,
}

impl std::fmt::Debug for AppUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppUser")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl AppUser {
    /// Checks a name and password (see the type's documentation).
    pub fn new(username: &str, password: &str) -> Result<AppUser, MigrateError> {
        let bad = |m: String| Err(MigrateError::AppUser(m));
        if !valid_identifier(username, 32) {
            return bad(format!(
                "username {username:?} must be 1 to 32 of A-Z, a-z, 0-9, _"
            ));
        }
        if !(8..=128).contains(&password.len())
            || !password.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return bad(format!(
                "the password of {username} must be 8 to 128 letters and digits (no punctuation: it is written into CREATE USER); regenerate the secret with punctuation excluded"
            ));
        }
        Ok(AppUser {
            username: username.to_string(),
            password: password.to_string(),
        })
    }

    /// From a secret's `SecretString`: `{"username": ..., "password": ...}`.
    pub fn from_secret_string(secret: &str) -> Result<AppUser, MigrateError> {
        let value: serde_json::Value = serde_json::from_str(secret).map_err(|_| {
            MigrateError::AppUser("the secret is not JSON with username and password".into())
        })?;
        let field = |k: &str| {
            value
                .get(k)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| MigrateError::AppUser(format!("the secret has no string {k:?}")))
        };
        AppUser::new(field("username")?, field("password")?)
    }
}

fn valid_identifier(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Makes sure the application user exists with the secret's password and holds exactly
/// the [`APP_GRANTS`] on `db`'s database (run through `db`, signed in as the master
/// user). Idempotent: re-running it after the secret's password changed sets the new
/// one. Returns what it did, one line each (no password).
pub async fn ensure_app_user(db: &DataApi, user: &AppUser) -> Result<Vec<String>, MigrateError> {
    let database = db.database();
    if !valid_identifier(database, 64) {
        return Err(MigrateError::AppUser(format!(
            "database name {database:?} must be 1 to 64 of A-Z, a-z, 0-9, _"
        )));
    }
    // The master secret's user must never be handed to the functions (or have its
    // password changed here).
    let me = db
        .first_string("SELECT CURRENT_USER()", vec![])
        .await?
        .unwrap_or_default();
    if me.split('@').next() == Some(user.username.as_str()) {
        return Err(MigrateError::AppUser(format!(
            "the application secret names {}, the user migrations run as: give the functions a user of their own",
            user.username
        )));
    }
    let account = format!("'{}'@'%'", user.username);
    let mut done = Vec::new();
    db.execute(
        &format!(
            "CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '{}'",
            user.password
        ),
        vec![],
        None,
    )
    .await?;
    done.push(format!("user {account}: created unless it existed"));
    db.execute(
        &format!("ALTER USER {account} IDENTIFIED BY '{}'", user.password),
        vec![],
        None,
    )
    .await?;
    done.push(format!("user {account}: password set from its secret"));
    for (table, privileges) in APP_GRANTS {
        db.execute(
            &format!("GRANT {privileges} ON `{database}`.`{table}` TO {account}"),
            vec![],
            None,
        )
        .await?;
        done.push(format!("granted {privileges} on {database}.{table}"));
    }
    // What the user may do now, as the server says (needs the right to read the grant
    // tables, which Aurora's master user has).
    match db
        .execute(&format!("SHOW GRANTS FOR {account}"), vec![], None)
        .await
    {
        Ok(out) => {
            for grant in out
                .records()
                .iter()
                .filter_map(|r| r.first().and_then(field::string))
            {
                // MariaDB shows the password hash: never print it.
                let grant = match grant.find(" IDENTIFIED BY") {
                    Some(at) => &grant[..at],
                    None => &grant,
                };
                done.push(format!("  {grant}"));
            }
        }
        Err(err) => done.push(format!("(SHOW GRANTS FOR {account} failed: {err})")),
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let sql = "-- a comment; not a statement\nCREATE TABLE a (x VARCHAR(3) DEFAULT ';');\n# another; one\nINSERT INTO a VALUES ('it''s; fine', \"q;\");\n\n";
        assert_eq!(
            split_statements(sql),
            vec![
                "CREATE TABLE a (x VARCHAR(3) DEFAULT ';')",
                "INSERT INTO a VALUES ('it''s; fine', \"q;\")"
            ]
        );
    }

    #[test]
    fn a_delimiter_line_keeps_a_compound_statement_whole() {
        let sql = "DROP TRIGGER IF EXISTS t;\n\ndelimiter //\nCREATE TRIGGER t BEFORE DELETE ON v FOR EACH ROW\nBEGIN\n  -- why; not a statement\n  IF OLD.a = ';' THEN\n    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no // way';\n  END IF;\nEND//\nDELIMITER ;\nSELECT 1;";
        assert_eq!(
            split_statements(sql),
            vec![
                "DROP TRIGGER IF EXISTS t",
                "CREATE TRIGGER t BEFORE DELETE ON v FOR EACH ROW\nBEGIN\n  \n  IF OLD.a = ';' THEN\n    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no // way';\n  END IF;\nEND",
                "SELECT 1",
            ]
        );
    }

    #[test]
    fn the_delete_guard_is_one_trigger_statement() {
        let m = &embedded()[1];
        let s = m.statements();
        assert_eq!(s.len(), 2, "{s:#?}");
        assert!(s[0].starts_with("DROP TRIGGER IF EXISTS vouchers_delete_guard"));
        assert!(s[1].starts_with("CREATE TRIGGER vouchers_delete_guard"));
        assert!(s[1].ends_with("END"), "{}", s[1]);
    }

    #[test]
    fn every_file_in_migrations_is_embedded_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.ends_with(".sql"))
            .collect();
        files.sort();
        let names: Vec<String> = EMBEDDED.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(files, names, "add the new file to migrate::EMBEDDED");
        let versions: Vec<u32> = embedded().iter().map(|m| m.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]) && versions[0] == 1);
    }

    #[test]
    fn only_already_applied_ddl_errors_are_skipped() {
        for applied in [
            "Duplicate column name 'pay_within_ms'",
            "Duplicate key name 'orders_one_holder'",
            "Can't DROP INDEX `orders_one_per_user`; check that it exists",
            "Can't DROP 'orders_one_per_user'; check that column/key exists",
            "Duplicate check constraint name 'vouchers_pay_within_positive'.",
        ] {
            assert!(already_applied(applied), "{applied}");
        }
        for other in [
            "Table 'orders' doesn't exist",
            "Duplicate entry '7' for key 'PRIMARY'",
        ] {
            assert!(!already_applied(other), "{other}");
        }
    }

    #[test]
    fn app_users_need_plain_names_and_passwords() {
        let u = AppUser::from_secret_string(
            r#"{"username":"seckill_app","password":"Ab3dEf6hIj9kLm2n"}"#,
        )
        .unwrap();
        assert_eq!(u.username, "seckill_app");
        assert!(!format!("{u:?}").contains("Ab3d"));
        for (name, pw) in [
            ("seckill_app", "short1"),
            ("seckill_app", "with'quote1234"),
            ("seckill_app", "with space 1234"),
            ("seckill-app", "Ab3dEf6hIj9kLm2n"),
            ("", "Ab3dEf6hIj9kLm2n"),
            ("a_name_that_is_far_too_long_for_mysql", "Ab3dEf6hIj9kLm2n"),
        ] {
            assert!(AppUser::new(name, pw).is_err(), "{name:?} {pw:?}");
        }
        assert!(AppUser::from_secret_string("{}").is_err());
        assert!(AppUser::from_secret_string("not json").is_err());
    }

    #[test]
    fn the_schema_splits_into_its_tables() {
        let m = &embedded()[0];
        let s = m.statements();
        assert_eq!(s.len(), 2);
        assert!(s[0].starts_with("CREATE TABLE IF NOT EXISTS vouchers"));
        assert!(s[1].starts_with("CREATE TABLE IF NOT EXISTS orders"));
    }
}
