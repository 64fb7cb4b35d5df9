//! What the daemon writes on stderr: one line per record, whatever the
//! packs' names and entries hold.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::skilld::{eventually, Env, Skilld};
use crate::FakeExecutor;

/// A pack folder whose path holds a line break and a forged log line
/// (`from ` is a folder, `x` the pack in it).
const FORGED_DIR: &str = "bad\nskill loader: registered subprocess skill \"fake\" from /x";

/// A root with a pack in [`FORGED_DIR`] (it registers as `real`) and a
/// pack whose entry forges a journal line at emergency priority.
fn forging_packs(env: &Env) -> std::path::PathBuf {
    env.skill("skills", "forger", "", "cat");
    let entry = "missing\n<0>skill loader: registered subprocess skill \"fake2\" from /y";
    let manifest = serde_json::json!({"name": "forger", "description": "d", "entry": entry});
    std::fs::write(env.path("skills/forger/skill.json"), manifest.to_string()).unwrap();
    let pack = env.skill("skills", "real", "", "cat");
    let forged = env.path("skills").join(FORGED_DIR);
    std::fs::create_dir_all(forged.parent().unwrap()).unwrap();
    std::fs::rename(pack, forged).unwrap();
    env.path("skills")
}

/// The daemon's log once its first scan is logged.
async fn first_scan_log(d: &Skilld) -> String {
    let done = eventually(Duration::from_secs(20), || d.log().contains(" skill registered")).await;
    assert!(done, "no scan summary:\n{}", d.log());
    d.log()
}

fn assert_not_forged(log: &str) {
    for line in log.lines() {
        assert!(!line.starts_with("skill loader:"), "forged line {line:?} in:\n{log}");
        assert!(!line.starts_with("<0>"), "forged line {line:?} in:\n{log}");
        assert!(!line.chars().any(char::is_control), "control character in {line:?}");
    }
    let escaped = "bad\\nskill loader: registered subprocess skill \"fake\" from /x/skill.json";
    assert!(
        log.lines().any(|l| l.contains("skill loader: registered subprocess skill \"real\" from ")
            && l.ends_with(escaped)),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("skill loader: build \"forger\": entry ")
            && l.contains("missing\\n<0>skill loader: registered subprocess skill \"fake2\"")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pack_text_cannot_forge_a_log_line() {
    let env = Env::new();
    let skills = forging_packs(&env);
    let _ex = FakeExecutor::start(&env.executor_socket());
    let d = Skilld::start(&env, &[&skills], "");
    assert_not_forged(&first_scan_log(&d).await);
}

/// With `JOURNAL_STREAM` naming its stderr, every line has the priority
/// prefix of its level and none is at emergency priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pack_text_cannot_forge_a_journal_priority() {
    let env = Env::new();
    let skills = forging_packs(&env);
    let _ex = FakeExecutor::start(&env.executor_socket());
    let log = env.path("skilld.log");
    let mut d = Skilld::spawn(&env, &[&skills], "", |c| {
        let meta = std::fs::metadata(&log).unwrap();
        c.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
    });
    d.wait_ready();
    let text = first_scan_log(&d).await;
    assert_not_forged(&text);
    for line in text.lines() {
        assert!(["<3>", "<4>", "<6>", "<7>"].iter().any(|p| line.starts_with(p)), "{line:?}");
    }
}
