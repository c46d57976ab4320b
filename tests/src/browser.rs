//! A real browser for the page suites: Debian's `chromium`, headless, driven through
//! `chromedriver` (WebDriver) by `fantoccini`.
//!
//! Each [`Browser`] starts its own chromedriver on a free loopback port and one
//! chromium session with a fresh profile, so tests never share cookies or storage.
//! Chromium is started with the flags this machine's closed network needs (no
//! background networking, no component updates), and as root without its sandbox.
//! [`Browser::run`] saves a screenshot of every open tab under
//! `target/browser-screenshots/` when the test body fails, then fails the test.

use std::future::Future;
use std::net::TcpListener;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt;
use serde_json::{Value, json};

use crate::stack::workspace_root;

/// How long [`Browser::wait_text`] waits by default.
pub const WAIT: Duration = Duration::from_secs(30);

/// One browser session and its chromedriver (shared by clones; chromedriver ends when
/// the last clone is dropped).
#[derive(Clone)]
pub struct Browser {
    pub client: Client,
    /// chromedriver's address, for its Chrome-specific endpoints.
    driver_url: String,
    _driver: Arc<Driver>,
}

struct Driver(Mutex<Child>);

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(child) = self.0.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn program(name: &str, fallback: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| fallback.to_string())
}

impl Browser {
    /// Starts chromedriver (`CHROMEDRIVER`, default `/usr/bin/chromedriver`) and a
    /// headless chromium (`CHROMIUM`, default `/usr/bin/chromium`); panics saying how to
    /// install them when they are missing.
    pub async fn start() -> Browser {
        let driver_bin = program("CHROMEDRIVER", "/usr/bin/chromedriver");
        let chromium = program("CHROMIUM", "/usr/bin/chromium");
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {driver_bin}: {e} (install Debian's chromium and \
                     chromium-driver: scripts/setup.sh does)"
                )
            });
        let profile = std::env::temp_dir().join(format!("seckill-chromium-{port}"));
        let _ = std::fs::remove_dir_all(&profile);
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".to_string(),
            "--disable-gpu".to_string(),
            "--disable-dev-shm-usage".to_string(),
            "--disable-quic".to_string(),
            "--no-first-run".to_string(),
            "--disable-background-networking".to_string(),
            "--disable-component-update".to_string(),
            "--disable-sync".to_string(),
            "--window-size=1200,900".to_string(),
            format!("--user-data-dir={}", profile.display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_string(),
            json!({ "binary": chromium, "args": args }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("chromedriver at {url} gave no session: {e}"),
            }
        };
        Browser {
            client,
            driver_url: url,
            _driver: Arc::new(Driver(Mutex::new(driver))),
        }
    }

    /// Runs `body` with a new browser; if it fails, saves a screenshot of each tab as
    /// `target/browser-screenshots/<name>-<n>.png` (and the page's text beside it), then
    /// fails with the original message. The browser is closed either way.
    pub async fn run<F, Fut>(name: &str, body: F)
    where
        F: FnOnce(Browser) -> Fut,
        Fut: Future<Output = ()>,
    {
        let browser = Browser::start().await;
        let outcome = AssertUnwindSafe(body(browser.clone())).catch_unwind().await;
        if let Err(panic) = outcome {
            let saved = save_screenshots(&browser.client, name).await;
            eprintln!("{name} failed; screenshots and page texts: {saved:?}");
            let _ = browser.client.clone().close().await;
            std::panic::resume_unwind(panic);
        }
        let _ = browser.client.clone().close().await;
    }

    /// Opens `url` in the current tab.
    pub async fn open(&self, url: &str) {
        self.client.goto(url).await.expect("the page opens");
    }

    /// Opens `url` in a new tab and switches to it; returns the tab's handle.
    pub async fn open_tab(&self, url: &str) -> fantoccini::wd::WindowHandle {
        let tab = self
            .client
            .new_window(true)
            .await
            .expect("a new tab")
            .handle;
        self.client
            .switch_to_window(tab.clone())
            .await
            .expect("to the new tab");
        self.open(url).await;
        tab
    }

    /// Switches to a tab opened before.
    pub async fn to_tab(&self, tab: &fantoccini::wd::WindowHandle) {
        self.client
            .switch_to_window(tab.clone())
            .await
            .expect("to the tab");
    }

    /// The element `css` (it must exist).
    pub async fn find(&self, css: &str) -> Element {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    /// Clicks the element `css`.
    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
    }

    /// The text of `css` now (empty when it does not exist yet).
    pub async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(el) => el.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The attribute `name` of `css` now (`None` when either does not exist yet).
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        let el = self.client.find(Locator::Css(css)).await.ok()?;
        el.attr(name).await.ok().flatten()
    }

    /// Whether the button `css` is enabled now.
    pub async fn enabled(&self, css: &str) -> bool {
        self.find(css).await.is_enabled().await.unwrap_or(false)
    }

    /// Waits until `css`'s text satisfies `ok` (polling every 100 ms); the text.
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        self.wait_text_for(css, what, WAIT, ok).await
    }

    /// [`Browser::wait_text`] with its own time limit.
    pub async fn wait_text_for(
        &self,
        css: &str,
        what: &str,
        limit: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text(css).await;
            if ok(&text) {
                return text;
            }
            if Instant::now() > deadline {
                panic!("{css} never showed {what} within {limit:?}; it shows {text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the button `css` is enabled (or disabled).
    pub async fn wait_enabled(&self, css: &str, enabled: bool, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.enabled(css).await != enabled {
            assert!(
                Instant::now() < deadline,
                "{css} never became {} within {limit:?}",
                if enabled { "enabled" } else { "disabled" }
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets this browser's clock `skew_ms` off (JavaScript's `Date.now`, in every page
    /// opened from now on), as a buyer's machine with a wrong clock.
    pub async fn skew_clock(&self, skew_ms: i64) {
        self.before_each_page(&format!(
            "(() => {{ const real = Date.now.bind(Date); Date.now = () => real() + ({skew_ms}); }})();"
        ))
        .await;
    }

    /// Stands between every page opened from now on and the network, as a bad network
    /// or a server's answer the test needs would: `rule` is the body of an async JS
    /// function of `{method, path, nth, real}` (`nth`: how many calls of that method and
    /// path so far, this one included; `real()`: makes the call) that returns a
    /// `Response` to answer with, or nothing to let the call through. `fake(status,
    /// body)` builds a JSON answer. Every call is listed in `window.__calls` as
    /// "METHOD /path" ([`Browser::calls`]).
    pub async fn intercept(&self, rule: &str) {
        self.before_each_page(&format!(
            r#"(() => {{
              const real = window.fetch.bind(window);
              const fake = (status, body) => new Response(JSON.stringify(body),
                {{ status, headers: {{ "content-type": "application/json" }} }});
              const rule = async ({{ method, path, nth, real }}) => {{ {rule} }};
              window.__calls = [];
              window.fetch = async (url, opts = {{}}) => {{
                const method = opts.method ?? "GET";
                const path = new URL(String(url), location.href).pathname;
                const call = `${{method}} ${{path}}`;
                window.__calls.push(call);
                const nth = window.__calls.filter((c) => c === call).length;
                const answer = await rule({{ method, path, nth, real: () => real(url, opts) }});
                return answer ?? real(url, opts);
              }};
            }})();"#
        ))
        .await;
    }

    /// How many calls the page made so far whose "METHOD /path" ends with `suffix`
    /// (pages opened after [`Browser::intercept`]).
    pub async fn calls(&self, suffix: &str) -> usize {
        let listed = self.eval("return window.__calls ?? [];").await;
        listed
            .as_array()
            .expect("a list of calls")
            .iter()
            .filter(|c| c.as_str().is_some_and(|c| c.ends_with(suffix)))
            .count()
    }

    /// Runs `source` in every page opened from now on, before the page's own scripts:
    /// through chromedriver's DevTools passthrough
    /// (`Page.addScriptToEvaluateOnNewDocument`).
    async fn before_each_page(&self, source: &str) {
        let session = self
            .client
            .session_id()
            .await
            .expect("a session")
            .expect("a session id");
        let res = reqwest::Client::new()
            .post(format!(
                "{}/session/{session}/goog/cdp/execute",
                self.driver_url
            ))
            .json(&json!({
                "cmd": "Page.addScriptToEvaluateOnNewDocument",
                "params": { "source": source },
            }))
            .send()
            .await
            .expect("chromedriver answers");
        assert!(
            res.status().is_success(),
            "a script for every page: {}",
            res.status()
        );
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("the page ran no {script:?}: {e}"))
    }
}

/// Where failing tests leave their screenshots.
pub fn screenshot_dir() -> PathBuf {
    workspace_root().join("target/browser-screenshots")
}

async fn save_screenshots(client: &Client, name: &str) -> Vec<PathBuf> {
    let dir = screenshot_dir();
    let _ = std::fs::create_dir_all(&dir);
    let mut saved = Vec::new();
    let tabs = client.windows().await.unwrap_or_default();
    for (n, tab) in tabs.into_iter().enumerate() {
        if client.switch_to_window(tab).await.is_err() {
            continue;
        }
        if let Ok(png) = client.screenshot().await {
            let path = dir.join(format!("{name}-{n}.png"));
            if std::fs::write(&path, png).is_ok() {
                saved.push(path);
            }
        }
        if let Ok(text) = client.find(Locator::Css("body")).await
            && let Ok(text) = text.text().await
        {
            let _ = std::fs::write(dir.join(format!("{name}-{n}.txt")), text);
        }
    }
    saved
}
