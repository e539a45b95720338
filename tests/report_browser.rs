//! `shardc report` as a person uses it: compile the quickstart on 8 devices, train it a few
//! steps with `--stats`, write the report, open it in headless Chromium, and check that the
//! graph rendered, that clicking an op's box shows its plan (the strategy `shardc explain`
//! prints), that `#op=NAME` selects an op, and that the page logged no error.
//!
//! Chromium is driven through the DevTools protocol over `--remote-debugging-pipe` (JSON
//! messages ending in a NUL byte on file descriptors 3 and 4), so nothing but the browser is
//! needed. Without Chromium the test fails and says to run `scripts/install-chromium.sh`,
//! unless `SHARDC_SKIP_BROWSER_TESTS=1` opts out. `SHARDC_UPDATE_SCREENSHOT=1` also writes the
//! screenshot to `docs/images/report.png`.

mod cli_common;

use cli_common::{path_str, run_shardc, shardc_ok, text, tmp};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The browser: `SHARDC_CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SHARDC_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
        .find(|p| p.is_file())
}

/// The browser, or `None` when the tests opt out; a missing browser otherwise fails.
fn browser_or_skip() -> Option<PathBuf> {
    if std::env::var("SHARDC_SKIP_BROWSER_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("SHARDC_SKIP_BROWSER_TESTS=1: the report's browser test is skipped");
        return None;
    }
    match chromium() {
        Some(p) => Some(p),
        None => panic!(
            "no Chromium found (chromium or chromium-browser on PATH, or SHARDC_CHROMIUM): \
             run scripts/install-chromium.sh, or set SHARDC_SKIP_BROWSER_TESTS=1 to skip"
        ),
    }
}

/// A headless Chromium driven over the DevTools pipe, attached to one page.
struct Browser {
    child: Child,
    to: std::fs::File,
    from: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Events seen so far that are errors: exceptions, console errors, log errors.
    errors: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(exe: &Path) -> Browser {
        let profile = tempfile::tempdir().expect("a profile folder");
        let mut to_browser = [0i32; 2];
        let mut from_browser = [0i32; 2];
        // SAFETY: pipe fills the two arrays with new descriptors.
        unsafe {
            assert_eq!(libc::pipe(to_browser.as_mut_ptr()), 0);
            assert_eq!(libc::pipe(from_browser.as_mut_ptr()), 0);
        }
        let (child_in, child_out) = (to_browser[0], from_browser[1]);
        let mut cmd = Command::new(exe);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--window-size=1400,1000",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec: the browser reads
        // commands on fd 3 and writes replies on fd 4.
        unsafe {
            cmd.pre_exec(move || {
                let a = libc::fcntl(child_in, libc::F_DUPFD, 10);
                let b = libc::fcntl(child_out, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        // SAFETY: the descriptors are ours; each is owned by one File from here on.
        let (to, from) = unsafe {
            libc::close(child_in);
            libc::close(child_out);
            (
                std::fs::File::from_raw_fd(to_browser[1]),
                std::fs::File::from_raw_fd(from_browser[0]),
            )
        };
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(from);
            loop {
                let mut buf = Vec::new();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        buf.pop();
                        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to,
            from: rx,
            next_id: 0,
            session: String::new(),
            errors: Vec::new(),
            _profile: profile,
        };
        let targets = b.call("Target.getTargets", json!({}), false);
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .map(|t| t["targetId"].clone())
            .expect("a page target");
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": page, "flatten": true}),
            false,
        );
        b.session = attached["sessionId"].as_str().expect("a session").into();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(domain, json!({}), true);
        }
        b
    }

    /// Sends a command (to the page's session when `page`) and waits for its reply.
    fn call(&mut self, method: &str, params: Value, page: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if page {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).expect("JSON");
        bytes.push(0);
        self.to
            .write_all(&bytes)
            .expect("the browser reads its pipe");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no reply to {method} within 60 s"));
            if v["id"] == json!(id) {
                if let Some(e) = v.get("error") {
                    panic!("{method} failed: {e}");
                }
                return v["result"].clone();
            }
            self.note(&v);
        }
    }

    /// Records an event that reports an error.
    fn note(&mut self, v: &Value) {
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => self
                .errors
                .push(format!("exception: {}", v["params"]["exceptionDetails"])),
            Some("Runtime.consoleAPICalled")
                if matches!(v["params"]["type"].as_str(), Some("error" | "assert")) =>
            {
                self.errors
                    .push(format!("console.error: {}", v["params"]["args"]))
            }
            Some("Log.entryAdded") if v["params"]["entry"]["level"] == "error" => self
                .errors
                .push(format!("log error: {}", v["params"]["entry"]["text"])),
            _ => {}
        }
    }

    /// Waits for an event of `method` (others noted).
    fn wait_event(&mut self, method: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {method} within 60 s"));
            self.note(&v);
            if v["method"] == method {
                return;
            }
        }
    }

    /// Opens `url` and waits for its load event.
    fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}), true);
        self.wait_event("Page.loadEventFired");
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            true,
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// A mouse click at page coordinates (x, y), as a person's.
    fn click(&mut self, x: f64, y: f64) {
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
                true,
            );
        }
    }

    /// Drains the events that arrived, noting errors.
    fn drain(&mut self) {
        while let Ok(v) = self.from.recv_timeout(Duration::from_millis(200)) {
            self.note(&v);
        }
    }

    fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}), true);
        base64(r["data"].as_str().expect("screenshot data"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Decodes standard base64.
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(val) {
        acc = (acc << 6) | c as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The `strategy` line of `shardc explain ART --op OP`.
fn explained_strategy(art: &Path, op: &str) -> String {
    let e = shardc_ok(&["explain", path_str(art), "--op", op]);
    e.lines()
        .find_map(|l| l.trim().strip_prefix("strategy"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no strategy line in:\n{e}"))
}

#[test]
fn the_report_of_the_quickstart_renders_and_shows_an_op_s_plan_on_click() {
    let Some(exe) = browser_or_skip() else { return };
    let dir = tmp("report", "quickstart");
    std::fs::create_dir_all(&dir).unwrap();
    let art = dir.join("art");
    cli_common::compile_quickstart(
        &art,
        &["--device-num", "8", "--parallel-mode", "auto_parallel"],
    );
    // Measured times: `run --stats` writes every rank's into the artifact.
    let run = run_shardc(&["run", path_str(&art), "--steps", "3", "--stats"]);
    assert!(run.status.success(), "{}", text(&run));
    assert!(art.join("stats/rank_0.json").is_file(), "{}", text(&run));
    let page = dir.join("report.html");
    let out = shardc_ok(&["report", path_str(&art), "-o", path_str(&page)]);
    assert!(out.contains("measured times"), "{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing fetched at view time (the SVG namespace is a name, not a
    // fetch).
    let fetched = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for remote in ["http://", "https://", "<link ", " src=\"", "@import"] {
        assert!(!fetched.contains(remote), "the page refers to {remote}");
    }

    let mut b = Browser::start(&exe);
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let t0 = Instant::now();
    b.open(&url);
    let opened = t0.elapsed();
    // The graph: laid out boxes, one per op of the quickstart's step but the optimizer's
    // updates, which are one box (no repeated layers here); every op is in a box.
    let boxes = b.eval("document.querySelectorAll('#graph g.box rect').length");
    let data = "JSON.parse(document.getElementById('data').textContent)";
    assert_eq!(boxes, b.eval(&format!("{data}.boxes.length")));
    assert!(boxes.as_u64().unwrap() >= 10, "{boxes}");
    let covered = b.eval(&format!(
        "(() => {{ const d = {data}; return d.boxes.reduce((n, b) => n + (b.op ? 1 : b.ops.length), 0) \
           === Object.keys(d.ops).length; }})()"
    ));
    assert_eq!(covered, json!(true));
    assert_eq!(
        b.eval("[...document.querySelectorAll('#graph g.box.folded')].length"),
        json!(1)
    );
    assert!(
        b.eval("document.querySelectorAll('#graph g.edge path').length")
            .as_u64()
            .unwrap()
            > 0
    );
    // Communication edges are drawn and labelled with their bytes.
    let labels = b.eval("[...document.querySelectorAll('#graph text')].map(t => t.textContent).filter(t => /All/.test(t)).join('|')");
    let labels = labels.as_str().unwrap();
    assert!(
        labels.contains("AllReduce") && labels.ends_with(" B"),
        "{labels}"
    );
    let widths = b.eval("[...document.querySelectorAll('#graph g.edge.comm path')].map(p => Number(p.getAttribute('stroke-width')))");
    assert!(
        widths
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w.as_f64().unwrap() >= 2.0),
        "{widths}"
    );
    // The memory chart: a bar per group of ranks.
    assert!(
        b.eval("document.querySelectorAll('#memchart .bar').length")
            .as_u64()
            .unwrap()
            >= 1
    );

    // Click matmul's box, as a person would.
    let at = b.eval(
        "(() => { const d = JSON.parse(document.getElementById('data').textContent); \
          const g = document.querySelector(`#graph g.box[data-box=\"${d.ops.matmul.box}\"]`); \
          g.scrollIntoView({block: 'center', inline: 'center'}); \
          const r = g.querySelector('rect').getBoundingClientRect(); \
          return [r.left + r.width / 2, r.top + r.height / 2]; })()",
    );
    let (x, y) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
    b.click(x, y);
    let shown = b.eval(
        "document.getElementById('detail-op') && document.getElementById('detail-op').textContent",
    );
    assert_eq!(shown, json!("matmul (MatMul)"));
    let strategy = b.eval("document.getElementById('detail-strategy').textContent");
    assert_eq!(
        strategy.as_str().unwrap(),
        explained_strategy(&art, "matmul")
    );
    assert_eq!(
        b.eval("document.querySelector('#graph g.box.selected') !== null"),
        json!(true)
    );
    // Its candidates or why there are none, and its predicted and measured time.
    let detail = b.eval("document.getElementById('detail').textContent");
    let detail = detail.as_str().unwrap();
    assert!(detail.contains("Candidates"), "{detail}");
    // The cost model's prediction and the run's measurement are both there for it.
    let times = b.eval(&format!(
        "(() => {{ const o = {data}.ops.matmul; return [o.predicted.compute_seconds, o.measured]; }})()"
    ));
    assert!(
        times[0].as_f64().unwrap() > 0.0 && times[1].as_f64().unwrap() > 0.0,
        "{times}"
    );
    assert!(
        detail.contains("predicted") && detail.contains("µs"),
        "{detail}"
    );

    // `#op=NAME` in the address selects an op, when the page opens with it...
    b.open("about:blank");
    b.open(&format!("{url}#op=relu"));
    assert_eq!(
        b.eval("document.getElementById('detail-op').textContent"),
        json!("relu (ReLU)")
    );
    let strategy = b.eval("document.getElementById('detail-strategy').textContent");
    assert_eq!(strategy.as_str().unwrap(), explained_strategy(&art, "relu"));

    // ... and when the address changes under the open page.
    b.eval("location.hash = 'op=matmul'; new Promise(r => setTimeout(r, 100))");
    assert_eq!(
        b.eval("document.getElementById('detail-op').textContent"),
        json!("matmul (MatMul)")
    );
    let png = b.screenshot();
    b.drain();
    assert!(
        b.errors.is_empty(),
        "the page logged errors: {:#?}",
        b.errors
    );
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    std::fs::write(dir.join("report.png"), &png).unwrap();
    if std::env::var("SHARDC_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let to = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images/report.png");
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(&to, &png).unwrap();
    }
    eprintln!(
        "report: {} bytes, opened in {:.0} ms (navigation to load event)",
        html.len(),
        opened.as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_of_a_one_device_artifact_or_of_no_artifact_is_refused_with_the_reason() {
    let dir = tmp("report", "errors");
    std::fs::create_dir_all(&dir).unwrap();
    let art = dir.join("one");
    cli_common::compile_quickstart(&art, &[]);
    let page = dir.join("r.html");
    let o = run_shardc(&["report", path_str(&art), "-o", path_str(&page)]);
    let e = text(&o);
    assert!(!o.status.success());
    assert!(e.contains(path_str(&art)) && e.contains("1 device"), "{e}");
    let eight = dir.join("eight");
    cli_common::compile_quickstart(&eight, &["--device-num", "8"]);
    let o = run_shardc(&[
        "report",
        path_str(&eight),
        "--rank",
        "8",
        "-o",
        path_str(&page),
    ]);
    let e = text(&o);
    assert!(!o.status.success());
    assert!(e.contains("--rank 8") && e.contains("ranks 0 to 7"), "{e}");
    let o = run_shardc(&["report", path_str(&dir), "-o", path_str(&page)]);
    let e = text(&o);
    assert!(!o.status.success());
    assert!(e.contains("not a shardc artifact"), "{e}");
    assert!(!page.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The 24-layer transformer on 512 devices: the report stays under 10 MB and opens in under
/// 2 s (about 12 s with its compile on 2 cores).
#[test]
fn the_report_of_a_24_layer_transformer_on_512_devices_is_small_and_opens_fast() {
    let Some(exe) = browser_or_skip() else { return };
    let dir = tmp("report", "t24");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("t24.ir");
    shardc_ok(&[
        "gen",
        "transformer",
        "--layers",
        "24",
        "--hidden",
        "1024",
        "--heads",
        "16",
        "--seq",
        "128",
        "--batch",
        "512",
        "-o",
        path_str(&model),
    ]);
    let art = dir.join("art");
    shardc_ok(&[
        "compile",
        path_str(&model),
        "-o",
        path_str(&art),
        "--device-num",
        "512",
        "--parallel-mode",
        "semi_auto_parallel",
    ]);
    let page = dir.join("report.html");
    let t = Instant::now();
    shardc_ok(&["report", path_str(&art), "-o", path_str(&page)]);
    let built = t.elapsed();
    let size = std::fs::metadata(&page).unwrap().len();
    let mut b = Browser::start(&exe);
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let t0 = Instant::now();
    b.open(&url);
    let opened = t0.elapsed();
    let nav = b.eval("performance.getEntriesByType('navigation')[0].loadEventEnd");
    b.drain();
    assert!(b.errors.is_empty(), "{:#?}", b.errors);
    eprintln!(
        "24 layers on 512 devices: report {size} bytes, built in {:.1} s, opened in {:.0} ms \
         (load event at {nav} ms of the navigation timing)",
        built.as_secs_f64(),
        opened.as_secs_f64() * 1e3
    );
    assert!(size < 10_000_000, "{size} bytes");
    assert!(opened < Duration::from_secs(2), "{opened:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
