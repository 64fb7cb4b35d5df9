//! End-to-end suite: both real daemons as real processes on temp sockets
//! (`ongrid-executor serve` + `ongrid-skilld`, or `ongrid-skill up`), real
//! skills under the real sandbox, the loader's own HTTP client on the Unix
//! socket (raw sockets where a case checks the bytes on the wire). Needs `cargo build --workspace --bins` first (scripts/test does
//! it). Works as root (skills run as `ongrid-skill`) and as another user
//! (skills keep that uid, no cgroup).
//!
//! Cases: [`api`] list/show/run outcomes, [`reload`], [`restart`] of the
//! executor and of skilld's drain on SIGTERM, [`cancel`] on client
//! disconnect, [`load`] (200 runs from 20
//! clients), [`malformed`] HTTP and JSON-RPC corpora, [`up`] (the demo
//! command and the README's curl examples), [`rogue`] (a client skipping
//! ongrid-skilld cannot exceed `[[peers]]`), [`approvals`] (docs/operating.md's
//! permissions and approvals walk-through, run as written), [`mcp`]
//! (`ongrid-skill mcp`: a real MCP session over stdio, SKILL.md tools),
//! [`mcp_packs`] (MCP server packs' tools as skills: a fake server with a
//! secret, the reference filesystem server, through the API and our MCP
//! front),
//! [`packs`] (the example packs in the real sandbox against loopback
//! listeners), [`faults`] (daemons SIGKILLed mid-run, the audit database on
//! a full or read-only file system, the executor socket gone, packs changed
//! after the scan), [`bounds`] (connection caps, header and idle timeouts),
//! [`queue`] (runs waiting for an executor slot), [`openapi`] (the API's
//! OpenAPI document: validated, served, fuzzed by Schemathesis),
//! [`monitoring`] (the packaged Grafana dashboard and Prometheus alerts
//! against a real Prometheus server scraping the daemons, see
//! [`prometheus`]), [`warm`] (warm runs and their pool in the skill's
//! detail). Every answer the harness's client receives is checked
//! against the OpenAPI document ([`contract`]).

mod contract;
mod harness;

mod api;
mod approvals;
mod bounds;
mod cancel;
mod clients;
mod faults;
mod load;
mod malformed;
mod mcp;
mod mcp_packs;
mod monitoring;
mod openapi;
mod packs;
mod prometheus;
mod queue;
mod reload;
mod restart;
mod rogue;
mod up;
mod warm;
