//! The monitoring mixin of `packaging/monitoring/` proven against the
//! real daemons: the alerting rules pass `promtool check rules` and their
//! unit tests (a firing and a not-firing case for every alert), the
//! dashboard's JSON is well formed, and every query of the dashboard,
//! evaluated by a real Prometheus server scraping a loaded ongrid-skilld,
//! returns data. Without `promtool` or `prometheus` on `PATH` the cases
//! that need them print `SKIP:` naming the binary (CI installs both).

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{eventually, write_skill, Stack};
use crate::prometheus::{on_path, sample_value, Prometheus, JOB};

/// What `$__rate_interval` and `$__interval` stand for when the queries are
/// evaluated: a window covering the load (Grafana's own value, four scrape
/// intervals at least, would be 4 s here).
const RATE_INTERVAL: &str = "1m";
const INTERVAL: &str = "15s";

/// `packaging/monitoring/<name>`.
fn mixin_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/monitoring").join(name)
}

/// The binary `name` on `PATH`, or `None` after printing the skip line.
fn tool(case: &str, name: &str) -> Option<PathBuf> {
    let found = on_path(name);
    if found.is_none() {
        ongrid_tests::host::skip(case, &format!("{name} is not installed (Debian: prometheus)"));
    }
    found
}

/// Runs `promtool args...` in `packaging/monitoring/`, asserting success.
fn promtool(promtool: &PathBuf, args: &[&str]) -> String {
    let out = std::process::Command::new(promtool)
        .args(args)
        .current_dir(mixin_file(""))
        .output()
        .unwrap_or_else(|e| panic!("run promtool: {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}: {}\n{text}", out.status);
    text
}

/// The alert names of the rules file (`- alert: NAME` lines).
fn alert_names() -> Vec<String> {
    let rules = fs::read_to_string(mixin_file("ongrid-alerts.yml")).unwrap();
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// Every scrape job the docs tell operators to write is the job the
/// shipped `OngridSkilldDown` alert selects: another name leaves a skilld
/// that is down unpaged.
#[test]
fn the_documented_scrape_job_is_the_one_the_alerts_select() {
    let rules = fs::read_to_string(mixin_file("ongrid-alerts.yml")).unwrap();
    let selected = rules
        .split("up{job=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("OngridSkilldDown selects up{job=...}");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut documented = 0;
    for doc in ["docs/operating.md", "packaging/monitoring/README.md", "README.md"] {
        let text = fs::read_to_string(root.join(doc)).unwrap();
        for line in text.lines().filter(|l| l.contains("job_name:")) {
            let name = line.split("job_name:").nth(1).unwrap().split_whitespace().next().unwrap();
            assert_eq!(name, selected, "{doc}: {line}");
            documented += 1;
        }
    }
    assert!(documented >= 2, "the scrape job is documented in {documented} places");
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let case = "alert_rules_pass_promtool_check_and_their_unit_tests";
    let Some(bin) = tool(case, "promtool") else { return };
    let names = alert_names();
    let checked = promtool(&bin, &["check", "rules", "ongrid-alerts.yml"]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", names.len())), "{checked}");
    let tested = promtool(&bin, &["test", "rules", "ongrid-alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a case where it fires and one where it does not:
    // an `alertname:` line followed by `exp_alerts: []` (none) or by
    // `exp_alerts:` and a list (firing).
    let tests = fs::read_to_string(mixin_file("ongrid-alerts.test.yml")).unwrap();
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for name in &names {
        let after: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == format!("alertname: {name}"))
            .map(|w| w[1])
            .collect();
        assert!(after.contains(&"exp_alerts: []"), "{name}: no case where it does not fire");
        assert!(after.contains(&"exp_alerts:"), "{name}: no case where it fires");
    }
    for want in [
        "OngridExecutorDown",
        "OngridAuditUnavailable",
        "OngridRunErrorRatioHigh",
        "OngridRunLatencyHigh",
        "OngridBusyRejections",
    ] {
        assert!(names.iter().any(|n| n == want), "no alert {want} in {names:?}");
    }
}

/// One query of the dashboard: its panel's title and its `expr`.
struct Query {
    panel: String,
    expr: String,
}

/// The dashboard, checked: a `datasource` variable of type prometheus,
/// every panel with an id, a title, a place and (rows aside) targets that
/// each have a PromQL `expr` and a refId of their own.
fn dashboard_queries() -> (Value, Vec<Query>) {
    let text = fs::read_to_string(mixin_file("ongrid-dashboard.json")).unwrap();
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 41), "schemaVersion");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "uid");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "title");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no datasource variable of type prometheus: {vars:?}"
    );
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut queries = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or_default().to_owned();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "{title}: id used twice");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}: datasource");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.unwrap_or_else(|| panic!("{title}: no targets"));
        let mut refs = BTreeSet::new();
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default().trim();
            assert!(!expr.is_empty(), "{title}: a target without an expr: {t}");
            assert!(refs.insert(t["refId"].as_str().expect("refId")), "{title}: refId twice");
            queries.push(Query { panel: title.clone(), expr: expr.to_owned() });
        }
    }
    (d, queries)
}

#[test]
fn the_dashboard_is_well_formed_and_covers_the_daemons() {
    let (_, queries) = dashboard_queries();
    let all: String = queries.iter().map(|q| format!("{}\n", q.expr)).collect();
    for want in [
        "ongrid_executions_total",
        "ongrid_run_duration_seconds_bucket",
        "ongrid_sandbox_setup_seconds_bucket",
        "ongrid_runs_in_flight",
        "ongrid_executor_runs_queued",
        "outcome=\"busy\"",
        "ongrid_audit_write_errors_total",
        "ongrid_executor_up",
    ] {
        assert!(all.contains(want), "no panel queries {want}");
    }
}

/// The metric names (`ongrid_*`) a PromQL expression uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ongrid_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// Two `hold` runs take both of skilld's slots, and one more request is
/// answered busy when its queue timeout passes. Returns the number of
/// requests sent. A hold that ends before the request's queue timeout
/// frees its slot and the request runs instead: tried again, 5 times at
/// most, the holds' answers printed. (A sandbox suite running at the same
/// time on the host SIGKILLs every leftover process of the run-as user,
/// holds included.)
fn busy_answer(s: &Arc<Stack>) -> usize {
    for attempt in 1..=5 {
        let holders: Vec<_> = (0..2)
            .map(|_| {
                let s = Arc::clone(s);
                std::thread::spawn(move || {
                    let r = s.execute("hold", &json!({}));
                    format!("{} {}", r.status, String::from_utf8_lossy(&r.body))
                })
            })
            .collect();
        let held = eventually(Duration::from_secs(20), || {
            s.scrape().contains("\nongrid_runs_in_flight 2\n")
        });
        let r = held.then(|| s.execute("echo", &json!({})));
        let holds: Vec<String> = holders.into_iter().map(|h| h.join().unwrap()).collect();
        match r {
            Some(r) if r.status == 503 => {
                assert_eq!(r.json()["error"]["code"], json!("busy"));
                return attempt * 3;
            }
            Some(r) => eprintln!("attempt {attempt}: answered {}; holds: {holds:?}", r.status),
            None => eprintln!("attempt {attempt}: the holds did not take both slots: {holds:?}"),
        }
    }
    panic!("no busy answer in 5 attempts:\n{}", s.logs());
}

/// Puts load on the daemons: one run of each skill first (one of them
/// refused a connection by its egress allowlist), a request
/// answered busy ([`busy_answer`]), then 320 runs from 8 clients, one in
/// 10 of the failing skill. Returns the number of requests. The first runs
/// make every labelled series the load feeds exist seconds before it, in a
/// scrape of their own: the 320 runs may all fall between two scrapes, and
/// a series first seen at its final value has no rate.
fn put_load(s: &Arc<Stack>) -> usize {
    assert_eq!(s.execute("echo", &json!({})).json()["outcome"], "ok");
    assert_eq!(s.execute("fail", &json!({})).json()["outcome"], "exit_nonzero");
    let refused = s.execute("refused", &json!({})).json();
    let denied = refused["sandbox"]["network"]["denied_total"].as_u64();
    assert!(denied.is_some_and(|n| n >= 1), "the loopback connect is refused: {refused}");
    // The audit row keeps the count; a run without network keeps none.
    let rows = s.get("/v1/audit?skill=refused&limit=1").json();
    assert_eq!(rows["items"][0]["network_denied"].as_u64(), denied, "{rows}");
    let rows = s.get("/v1/audit?skill=echo&limit=1").json();
    assert!(rows["items"][0]["network_denied"].is_null(), "{rows}");
    // And the executor's counter, which the egress panel reads.
    let text = s.scrape();
    let counted = text
        .lines()
        .find(|l| l.starts_with("ongrid_network_denied_total{skill=\"refused\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(counted, denied, "ongrid_network_denied_total of refused:\n{text}");
    let busy_requests = busy_answer(s);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let s = Arc::clone(s);
            std::thread::spawn(move || {
                for i in 0..40 {
                    let skill = if i % 10 == 3 { "fail" } else { "echo" };
                    let r = s.execute(skill, &json!({"n": c * 100 + i}));
                    assert!(
                        r.status == 200 || r.status == 503,
                        "{skill}: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    );
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    3 + busy_requests + 8 * 40
}

/// `expr` as Grafana sends it: its variables replaced (`$instance` by the
/// regex-escaped instance, as Grafana formats a variable for PromQL).
fn substitute(expr: &str, instance: &str) -> String {
    let escaped = instance.replace('.', "\\\\.");
    let out = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", INTERVAL)
        .replace("${instance}", &escaped)
        .replace("$instance", &escaped);
    assert!(!out.contains('$'), "a variable the test does not know in: {expr}");
    out
}

#[test]
fn every_dashboard_query_returns_data_from_a_live_prometheus() {
    let case = "every_dashboard_query_returns_data_from_a_live_prometheus";
    let Some(bin) = tool(case, "prometheus") else { return };
    let (dashboard, queries) = dashboard_queries();
    // `refused` is granted the network and tries loopback, which a bare
    // grant refuses in the kernel: the egress panel's counter.
    let s = Arc::new(Stack::start_with(
        "[skills.refused]\nnetwork = true\n",
        "max_concurrent_runs = 2\nqueue_timeout_seconds = 1\n",
    ));
    write_skill(
        &s.skills,
        "refused",
        r#","sandbox":{"network":true}"#,
        "/bin/bash -c 'echo > /dev/tcp/127.0.0.1/9' 2>/dev/null\necho '{}'",
    );
    // Holds a slot 5 s: the busy request's 1 s queue timeout ends long
    // before either hold does, even on a slow host.
    write_skill(&s.skills, "hold", r#","timeout_seconds":20"#, "/bin/sleep 5\necho '{}'");
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200);
    let rules = fs::canonicalize(mixin_file("ongrid-alerts.yml")).unwrap();
    let prom = Prometheus::start(&bin, s.metrics, &rules);
    // The first scrape comes once the server has loaded its targets (up
    // to 5 s after it is ready): the load starts after it, so the rates
    // over the load have samples before and after.
    let up = format!("up{{job=\"{JOB}\"}}");
    let scraped = eventually(Duration::from_secs(60), || prom.scalar(&up) == Some(1.0));
    assert!(scraped, "prometheus did not scrape {}:\n{}", s.metrics, prom.log());

    let requests = put_load(&s);
    // Every metric the dashboard names is exposed.
    let scraped = s.scrape();
    for q in &queries {
        for name in metric_names(&q.expr) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| name.strip_suffix(x))
                .unwrap_or(&name);
            assert!(
                scraped.contains(&format!("# TYPE {family} ")),
                "{}: {name} is not in /metrics:\n{scraped}",
                q.panel
            );
        }
    }
    // Prometheus has scraped the whole load, and a few scrapes more.
    let total = format!("sum(ongrid_executions_total{{job=\"{JOB}\"}})");
    let seen = eventually(Duration::from_secs(60), || {
        prom.scalar(&total).is_some_and(|n| n >= requests as f64)
    });
    assert!(seen, "prometheus did not see {requests} requests: {:?}", prom.scalar(&total));
    std::thread::sleep(Duration::from_secs(3));

    let instance = instance_variable(&prom, &dashboard, s.metrics);
    let mut failures = Vec::new();
    for q in &queries {
        let expr = substitute(&q.expr, &instance);
        let result = prom.query(&expr);
        if !result.iter().filter_map(sample_value).any(f64::is_finite) {
            failures.push(format!("{}: {expr}\n  -> {}", q.panel, Value::Array(result)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries returned no data:\n{}",
        failures.len(),
        queries.len(),
        failures.join("\n")
    );
    let scrapes = format!("count_over_time(up{{job=\"{JOB}\"}}[{RATE_INTERVAL}])");
    let good = format!("sum_over_time(up{{job=\"{JOB}\"}}[{RATE_INTERVAL}])");
    eprintln!(
        "{} dashboard queries returned data; {:?} of {:?} scrapes in the last {RATE_INTERVAL} \
         succeeded",
        queries.len(),
        prom.scalar(&good),
        prom.scalar(&scrapes)
    );
    rules_evaluate(&prom);
}

/// The `instance` variable's values, resolved as Grafana does for
/// `label_values(METRIC, instance)`: the test's one target.
fn instance_variable(prom: &Prometheus, dashboard: &Value, target: std::net::SocketAddr) -> String {
    let vars = dashboard["templating"]["list"].as_array().unwrap();
    let var = vars.iter().find(|v| v["name"] == "instance").expect("an instance variable");
    let definition = var["definition"].as_str().unwrap_or_default();
    let metric = definition
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(", instance)"))
        .unwrap_or_else(|| panic!("instance variable: {definition}"));
    let v = prom.api(&format!(
        "/api/v1/label/instance/values?match[]={}",
        crate::prometheus::encode(metric)
    ));
    let values: Vec<&str> =
        v["data"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert_eq!(values, [target.to_string()], "{definition}");
    target.to_string()
}

/// Prometheus loaded the packaged rules and evaluates each without error.
fn rules_evaluate(prom: &Prometheus) {
    let want = alert_names().len();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = prom.api("/api/v1/rules");
        let rules: Vec<Value> = v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        assert_eq!(rules.len(), want, "{v}");
        let bad: Vec<&Value> = rules.iter().filter(|r| r["health"] != "ok").collect();
        if bad.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "rules not evaluated cleanly: {bad:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
