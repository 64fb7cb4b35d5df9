//! Reload: `POST /v1/reload` and SIGHUP rescan and swap the registry.

use std::time::Duration;

use serde_json::json;

use crate::skilld::{eventually, Env, Skilld};
use crate::FakeExecutor;

/// A new pack appears and a removed one disappears after a reload; a run
/// started before the reload finishes with the skill it started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_picks_up_new_packs_and_drops_removed_ones() {
    let env = Env::new();
    let skills = env.standard_skills();
    let ex = FakeExecutor::start(&env.executor_socket());
    let d = Skilld::start(&env, &[&skills], "");
    let c = d.client();

    // A run in flight across the reload (sleeper is about to be removed).
    let in_flight = {
        let c = d.client();
        tokio::spawn(async move { c.post("/v1/skills/slow/execute", &json!({})).await })
    };
    // Its script has been read: the shell has become `sleep` (deleting
    // the folder before the shell opens run.sh would fail the run).
    let slow = skills.join("slow");
    let started = eventually(Duration::from_secs(20), || {
        ex.stats.runs_started.load(std::sync::atomic::Ordering::SeqCst) == 1 && sleeping_in(&slow)
    });
    assert!(started.await, "the in-flight run never started");

    env.skill("skills", "fresh", "", "echo '{\"fresh\":true}'");
    std::fs::remove_dir_all(skills.join("sleeper")).unwrap();
    std::fs::remove_dir_all(skills.join("slow")).unwrap();
    let r = c.post("/v1/reload", &json!({})).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"registered": 4, "skipped": 0}));
    assert_eq!(c.get("/v1/skills/sleeper").await.unwrap().status, 404);
    let r = c.post("/v1/skills/fresh/execute", &json!({})).await.unwrap();
    assert_eq!(r.body["result"], json!({"fresh": true}));

    let r = in_flight.await.unwrap().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["outcome"], "timeout", "the in-flight run was not disturbed");

    // A broken manifest is skipped and counted, the rest stays.
    std::fs::write(skills.join("fresh/skill.json"), "{not json").unwrap();
    let r = c.post("/v1/reload", &json!({})).await.unwrap();
    assert_eq!(r.body, json!({"registered": 3, "skipped": 1}));
}

/// SIGHUP rescans too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rescans() {
    let env = Env::new();
    let skills = env.standard_skills();
    let d = Skilld::start(&env, &[&skills], "");
    env.skill("skills", "hup", "", "echo '{}'");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let c = d.client();
    let mut found = false;
    for _ in 0..250 {
        if c.get("/v1/skills/hup").await.unwrap().status == 200 {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(found, "{}", d.log());
    assert!(eventually(Duration::from_secs(1), || d.log().contains("SIGHUP")).await);
    let status = d.stop();
    assert!(status.success(), "{status}");
}

/// A process whose working directory is `dir` runs `sleep`.
fn sleeping_in(dir: &std::path::Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs.flatten().any(|p| {
        std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd == dir)
            && std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))
    })
}

/// `GET /v1/registry`: the generation at once without `since`; with it, a
/// long poll answered when a reload moves it, or when `wait` runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_generation_is_a_long_poll_a_reload_answers() {
    let env = Env::new();
    let skills = env.standard_skills();
    let _ex = FakeExecutor::start(&env.executor_socket());
    let d = Skilld::start(&env, &[&skills], "");
    let c = d.client();
    let r = c.get("/v1/registry").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let first = r.body["generation"].as_u64().expect("a number");

    let asked = std::time::Instant::now();
    let r = c.get(&format!("/v1/registry?since={first}&wait=1")).await.unwrap();
    assert_eq!(r.body["generation"], first, "nothing moved");
    assert!(asked.elapsed() >= Duration::from_millis(900), "it waited: {:?}", asked.elapsed());

    let poll = {
        let c = d.client();
        tokio::spawn(async move { c.get(&format!("/v1/registry?since={first}&wait=30")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = std::time::Instant::now();
    assert_eq!(c.post("/v1/reload", &json!({})).await.unwrap().status, 200);
    let r = poll.await.unwrap().unwrap();
    assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
    let moved = r.body["generation"].as_u64().expect("a number");
    assert_ne!(moved, first, "the reload moved it");
    // Another generation than the caller's is answered at once.
    let r = c.get(&format!("/v1/registry?since={first}&wait=30")).await.unwrap();
    assert_eq!(r.body["generation"], moved);
    for bad in ["since=x", "since=1&wait=301", "wait=-1"] {
        let r = c.get(&format!("/v1/registry?{bad}")).await.unwrap();
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
}

/// SIGTERM during a SIGHUP reload that waits for an MCP server's tools
/// ends the daemon at once, not once the reload gives up on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_heard_during_a_long_sighup_reload() {
    use std::sync::atomic::Ordering::SeqCst;
    let env = Env::new();
    let skills = env.standard_skills();
    let ex = FakeExecutor::start(&env.executor_socket());
    let mut d = Skilld::start(&env, &[&skills], "");
    ex.stats.mcp_tools_delay_ms.store(u64::MAX, SeqCst);
    env.skill("skills", "server", r#","kind":"mcp""#, "exec cat");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let asked = eventually(Duration::from_secs(10), || ex.stats.mcp_tools_calls.load(SeqCst) == 1);
    assert!(asked.await, "the reload never asked for the server's tools:\n{}", d.log());
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let status = d.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

/// The tools of several MCP server packs are listed all at once: a start
/// waits for the slowest list (1.5 s here), not for their sum (6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_packs_are_listed_together() {
    use std::sync::atomic::Ordering::SeqCst;
    let env = Env::new();
    let skills = env.standard_skills();
    for name in ["one", "two", "three", "four"] {
        env.skill("skills", name, r#","kind":"mcp""#, "exec cat");
    }
    let ex = FakeExecutor::start(&env.executor_socket());
    ex.stats.mcp_tools_delay_ms.store(1500, SeqCst);
    let started = std::time::Instant::now();
    let d = Skilld::start(&env, &[&skills], "");
    let r = d.client().get("/v1/health").await.unwrap();
    assert_eq!(r.status, 200, "{}", d.log());
    let took = started.elapsed();
    assert_eq!(ex.stats.mcp_tools_calls.load(SeqCst), 4, "{}", d.log());
    assert!(took < Duration::from_millis(4500), "the lists were waited for in turn: {took:?}");
}

/// A server's tool list moving again and again while each listing takes a
/// second: one listing of the pack at a time, none queued behind it once
/// the moves stop, and a reload meanwhile waits for none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_of_a_tool_list_queue_no_listings() {
    use std::sync::atomic::Ordering::SeqCst;
    let env = Env::new();
    let skills = env.standard_skills();
    env.skill("skills", "server", r#","kind":"mcp""#, "exec cat");
    let ex = FakeExecutor::start(&env.executor_socket());
    ex.stats.mcp_tools_delay_ms.store(1000, SeqCst);
    let d = Skilld::start(&env, &[&skills], "");
    let c = d.client();
    assert_eq!(c.get("/v1/health").await.unwrap().status, 200);
    ex.stats.mcp_moves.store(true, SeqCst);
    // Moves every 50 ms for 3 s (the watch asks again within its 1 s rest).
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let started = std::time::Instant::now();
    let r = c.post("/v1/reload", &json!({})).await.unwrap();
    assert_eq!(r.status, 200, "{}", d.log());
    let reload = started.elapsed();
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(reload)).await;
    ex.stats.mcp_moves.store(false, SeqCst);
    // The listing under way ends within its second; nothing follows it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let settled = ex.stats.mcp_tools_calls.load(SeqCst);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let later = ex.stats.mcp_tools_calls.load(SeqCst);
    assert_eq!(later, settled, "listings queued behind the moves went on:\n{}", d.log());
    assert!(reload < Duration::from_millis(2500), "the reload waited {reload:?}");
}

/// A move of a pack's tool list seen while that pack is being listed has
/// it listed once more afterwards (the listing under way may have answered
/// before the move), and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_seen_during_a_listing_is_listed_after_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let env = Env::new();
    let skills = env.standard_skills();
    env.skill("skills", "server", r#","kind":"mcp""#, "exec cat");
    let ex = FakeExecutor::start(&env.executor_socket());
    ex.stats.mcp_tools_delay_ms.store(1000, SeqCst);
    let d = Skilld::start(&env, &[&skills], "");
    assert_eq!(d.client().get("/v1/health").await.unwrap().status, 200);
    let before = ex.stats.mcp_tools_calls.load(SeqCst);
    ex.stats.mcp_moves.store(true, SeqCst);
    let listing =
        eventually(Duration::from_secs(5), || ex.stats.mcp_tools_calls.load(SeqCst) > before);
    assert!(listing.await, "no listing after a move:\n{}", d.log());
    // More moves while it lists, then none.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ex.stats.mcp_moves.store(false, SeqCst);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let listed = ex.stats.mcp_tools_calls.load(SeqCst) - before;
    assert_eq!(listed, 2, "the listing and one after it for the moves it may have missed");
}

/// SIGHUPs that come during a rescan make one more rescan, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighups_during_a_rescan_make_one_more() {
    use std::sync::atomic::Ordering::SeqCst;
    let env = Env::new();
    let skills = env.standard_skills();
    env.skill("skills", "server", r#","kind":"mcp""#, "exec cat");
    let ex = FakeExecutor::start(&env.executor_socket());
    ex.stats.mcp_tools_delay_ms.store(1000, SeqCst);
    let d = Skilld::start(&env, &[&skills], "");
    assert_eq!(d.client().get("/v1/health").await.unwrap().status, 200);
    let before = ex.stats.mcp_tools_calls.load(SeqCst);
    for _ in 0..5 {
        d.signal(nix::sys::signal::Signal::SIGHUP);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let rescans = ex.stats.mcp_tools_calls.load(SeqCst) - before;
    assert_eq!(rescans, 2, "each rescan lists the pack once:\n{}", d.log());
}
