//! A WebDriver session on Debian's headless Chromium, driven by Debian's `chromedriver` over
//! plain HTTP (the W3C WebDriver protocol): what the UI tests use to open, read, screenshot and
//! print the showback pages.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// A WebDriver session on a headless Chromium.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Browser {
    pub async fn start() -> Browser {
        super::require_tool("chromedriver");
        super::require_tool("chromium");
        let port = super::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--disable-quic", "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync", "--window-size=1280,2000"]
            }
        }}});
        let mut session = None;
        for _ in 0..100 {
            if let Ok(r) = http
                .post(format!("{base}/session"))
                .json(&caps)
                .send()
                .await
            {
                let v: Value = r.json().await.unwrap();
                session = Some(
                    v["value"]["sessionId"]
                        .as_str()
                        .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
                        .to_owned(),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Browser {
            driver,
            session: session.expect("chromedriver answers"),
            base,
            http,
        }
    }

    pub async fn cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut r = self.http.request(method.clone(), url);
        if method == reqwest::Method::POST {
            r = r.json(&body);
        }
        let r = r.send().await.unwrap();
        r.json::<Value>().await.unwrap()["value"].clone()
    }

    pub async fn go(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    pub async fn url(&self) -> String {
        let v = self.cmd(reqwest::Method::GET, "/url", Value::Null).await;
        v.as_str()
            .unwrap_or_else(|| panic!("no URL: {v}"))
            .to_owned()
    }

    pub async fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    pub async fn element(&self, css: &str) -> String {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    pub async fn sign_in(&self, app: &str, token: &str, path: &str) {
        self.go(&format!("{app}{path}")).await;
        assert!(self.url().await.contains("/signin"), "{}", self.url().await);
        let field = self.element("#token").await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{field}/value"),
            json!({ "text": token }),
        )
        .await;
        let button = self.element("button[type=submit]").await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{button}/click"),
            json!({}),
        )
        .await;
        let url = self.wait_for_url(|u| !u.contains("/signin")).await;
        assert!(url.ends_with(path), "signed in, at {url}, wanted {path}");
    }

    /// The page's URL once it satisfies `ok` (a form's navigation may finish after the click
    /// returns); the last URL seen after 10 s.
    pub async fn wait_for_url(&self, ok: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let url = self.url().await;
            if ok(&url) || std::time::Instant::now() > deadline {
                return url;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let png = self
            .cmd(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), bytes).unwrap();
    }

    /// The page printed to PDF on A4 portrait, saved beside the screenshots; its bytes.
    pub async fn print(&self, name: &str) -> Vec<u8> {
        use base64::Engine;
        let pdf = self
            .cmd(
                reqwest::Method::POST,
                "/print",
                json!({ "orientation": "portrait", "page": { "width": 21.0, "height": 29.7 } }),
            )
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(pdf.as_str().unwrap_or_else(|| panic!("no PDF: {pdf}")))
            .unwrap();
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.pdf")), &bytes).unwrap();
        bytes
    }

    /// The `data-value`s of a table's column, top to bottom.
    pub async fn column(&self, table: &str, column: &str) -> Vec<String> {
        let script = format!(
            "const t = document.getElementById('{table}'); if (!t) return null;
             const i = [...t.tHead.rows[0].cells].findIndex(c => c.dataset.column === '{column}');
             return [...t.tBodies[0].rows].map(r => r.cells[i].dataset.value);"
        );
        let v = self.js(&script).await;
        serde_json::from_value(v.clone()).unwrap_or_else(|_| panic!("{table}.{column}: {v}"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the WebDriver session first, so chromedriver closes Chromium (killing the driver
        // alone leaves the browser running). Plain HTTP: Drop cannot await.
        use std::io::{Read, Write};
        let addr = self.base.trim_start_matches("http://");
        if let Ok(mut c) = std::net::TcpStream::connect(addr) {
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                c,
                "DELETE /session/{} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session
            );
            // The answer comes once Chromium has quit.
            let _ = c.read(&mut [0u8; 1024]);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
