//! `seckill migrate`: applies `migrations/` through the RDS Data API with the master
//! secret, then, given the application user's secret, makes that user (its password
//! from the secret, read through Secrets Manager). Its variables: `seckill migrate --help`.

use std::time::Duration;

use anyhow::{Context as _, anyhow, ensure};
use aws_sdk_secretsmanager::error::DisplayErrorContext;
use seckill_shared::adapters::data_api::{self, DataApi};
use seckill_shared::config::{DataApiConfig, EnvReader};
use seckill_shared::migrate::{self, AppUser};

/// What `seckill migrate` works with.
#[derive(Debug, Clone)]
pub struct MigrateConfig {
    /// The cluster and database, signed in with the master secret.
    pub data_api: DataApiConfig,
    /// The application user's secret, when the user is to be made.
    pub app_secret_arn: Option<String>,
    /// Secrets Manager endpoint override (the local stack's data-api-local).
    pub secrets_manager_url: Option<String>,
}

impl MigrateConfig {
    pub fn read(env: &mut EnvReader) -> MigrateConfig {
        let master = env.optional("DB_MASTER_SECRET_ARN");
        let secret_arn = master.unwrap_or_else(|| env.required("DB_SECRET_ARN"));
        MigrateConfig {
            data_api: DataApiConfig {
                cluster_arn: env.required("DB_CLUSTER_ARN"),
                secret_arn,
                database: env.required("DB_NAME"),
                endpoint: env.optional("DATA_API_URL"),
                timeout: Duration::from_millis(env.parse_or("DATA_API_TIMEOUT_MS", 5_000)),
            },
            app_secret_arn: env.optional("DB_APP_SECRET_ARN"),
            secrets_manager_url: env.optional("SECRETS_MANAGER_URL"),
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    pub database: String,
    /// Migration versions applied now (empty: the schema was up to date).
    pub applied: Vec<u32>,
    /// What was done for the application user, one line each; `None` without its secret.
    pub app_user: Option<Vec<String>>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (applied, database) = (&self.applied, &self.database);
        if applied.is_empty() {
            writeln!(f, "schema of {database} is up to date")?;
        } else {
            writeln!(f, "applied migrations {applied:?} to {database}")?;
        }
        match &self.app_user {
            None => writeln!(
                f,
                "no application user secret given (DB_APP_SECRET_ARN): application user not checked"
            ),
            Some(lines) => lines.iter().try_for_each(|l| writeln!(f, "{l}")),
        }
    }
}

/// Runs `seckill migrate`.
pub async fn run(cfg: &MigrateConfig) -> anyhow::Result<Report> {
    let database = cfg.data_api.database.clone();
    let db = DataApi::connect(&cfg.data_api).await;
    let applied = migrate::apply(&db, &migrate::embedded())
        .await
        .with_context(|| format!("migrating database {database}"))?;
    let app_user = match &cfg.app_secret_arn {
        None => None,
        Some(arn) => {
            ensure!(
                *arn != cfg.data_api.secret_arn,
                "the application user's secret {arn} is the master secret: the functions need a secret of their own"
            );
            let user = read_app_user(arn, cfg.secrets_manager_url.as_deref()).await?;
            let done = migrate::ensure_app_user(&db, &user)
                .await
                .with_context(|| format!("making the application user {}", user.username))?;
            Some(done)
        }
    };
    Ok(Report {
        database,
        applied,
        app_user,
    })
}

/// The application user of a secret (`{"username", "password"}`), read with Secrets
/// Manager's GetSecretValue.
pub async fn read_app_user(secret_arn: &str, endpoint: Option<&str>) -> anyhow::Result<AppUser> {
    let shared = data_api::sdk_config(endpoint.is_some()).await;
    let mut builder = aws_sdk_secretsmanager::config::Builder::from(&shared).timeout_config(
        aws_sdk_secretsmanager::config::timeout::TimeoutConfig::builder()
            .operation_timeout(Duration::from_secs(10))
            .build(),
    );
    builder.set_endpoint_url(endpoint.map(str::to_string));
    let client = aws_sdk_secretsmanager::Client::from_conf(builder.build());
    let out = client
        .get_secret_value()
        .secret_id(secret_arn)
        .send()
        .await
        .map_err(|e| anyhow!("GetSecretValue {secret_arn}: {}", DisplayErrorContext(&e)))?;
    let secret = out
        .secret_string()
        .ok_or_else(|| anyhow!("secret {secret_arn} has no SecretString"))?;
    AppUser::from_secret_string(secret).with_context(|| format!("secret {secret_arn}"))
}
