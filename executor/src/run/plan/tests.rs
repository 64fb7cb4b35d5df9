use std::os::unix::fs::PermissionsExt;

use super::*;

fn pack(root: &Path, dir: &str, name: &str) -> PathBuf {
    let d = root.join(dir);
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    let entry = d.join("run.sh");
    fs::write(&entry, "#!/bin/sh\ncat\n").unwrap();
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    let m = d.join("skill.json");
    fs::write(&m, format!(r#"{{"name":"{name}","description":"d","entry":"run.sh"}}"#)).unwrap();
    fs::set_permissions(&m, fs::Permissions::from_mode(0o644)).unwrap();
    m
}

/// Whoever may write the manifest, a folder above it, or a folder the
/// entry's path crosses through a symlink could change what runs under the
/// skill's name and grant: each must pass the check the entry passes.
#[test]
fn a_writable_manifest_or_a_folder_the_entry_is_reached_through_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let mode = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    mode(t.path(), 0o755);
    let m = pack(t.path(), "a", "probe");
    let config = Config { roots: vec![t.path().to_owned()], ..Config::default() };
    let build = |m: &Path| Plan::build(&config, m, b"{}".to_vec(), &[]);
    assert!(build(&m).is_ok());
    let refused = |m: &Path, at: &Path| match build(m) {
        Err(e @ (PlanError::ManifestOwner { .. } | PlanError::Entry { .. })) => {
            assert_eq!(e.outcome(), Outcome::Rejected);
            let text = e.to_string();
            assert!(text.contains(&format!("{}: group or world writable", at.display())), "{text}");
        }
        other => panic!("{}: {other:?}", at.display()),
    };
    mode(&m, 0o666);
    refused(&m, &fs::canonicalize(&m).unwrap());
    mode(&m, 0o644);
    // A folder anyone may write, holding a manifest whose entry is
    // another pack's.
    let drop = t.path().join("drop");
    fs::create_dir(&drop).unwrap();
    mode(&drop, 0o777);
    let entry = fs::canonicalize(t.path().join("a/run.sh")).unwrap();
    let dropped = drop.join("skill.json");
    let text = format!(r#"{{"name":"probe","description":"d","entry":{entry:?}}}"#);
    fs::write(&dropped, text).unwrap();
    mode(&dropped, 0o644);
    refused(&dropped, &fs::canonicalize(&drop).unwrap());
    // The entry reached through a symlink in a folder anyone may write:
    // its link could be pointed at any other executable under the roots.
    let bin = t.path().join("a/bin");
    fs::create_dir(&bin).unwrap();
    mode(&bin, 0o777);
    std::os::unix::fs::symlink("../run.sh", bin.join("run")).unwrap();
    fs::write(&m, r#"{"name":"probe","description":"d","entry":"bin/run"}"#).unwrap();
    refused(&m, &fs::canonicalize(&bin).unwrap());
    mode(&bin, 0o755);
    assert!(build(&m).is_ok(), "the same link in a folder only its owner may write");
    // A link reached through another link: the folder holding the second.
    let links = t.path().join("links");
    fs::create_dir(&links).unwrap();
    mode(&links, 0o777);
    std::os::unix::fs::symlink("../a/run.sh", links.join("run")).unwrap();
    std::os::unix::fs::symlink("../links/run", t.path().join("a/hop")).unwrap();
    fs::write(&m, r#"{"name":"probe","description":"d","entry":"hop"}"#).unwrap();
    refused(&m, &fs::canonicalize(&links).unwrap());
    mode(&links, 0o755);
    assert!(build(&m).is_ok());
}

/// Only a `skill.json` (or a `SKILL.md`) is a manifest: another file
/// under a root that parses as one, naming any skill, is refused.
#[test]
fn a_file_not_named_skill_json_is_no_manifest() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = pack(t.path(), "a", "real");
    let config = Config { roots: vec![t.path().to_owned()], ..Config::default() };
    assert!(Plan::build(&config, &m, b"{}".to_vec(), &[]).is_ok());
    for name in ["fixture.json", "skill.json.bak", "Skill.json"] {
        let other = m.with_file_name(name);
        fs::copy(&m, &other).unwrap();
        let e = Plan::build(&config, &other, b"{}".to_vec(), &[]).unwrap_err();
        assert!(matches!(e, PlanError::NotAManifest { .. }), "{name}: {e}");
    }
}

/// A grant pinned to one manifest (`[skills.NAME] manifest`) is that
/// file's alone: a second `skill.json` under the roots declaring the
/// same name (which the loader skips as a duplicate, but which can be
/// sent straight to the executor's socket) is refused, whatever it
/// asks for. Unpinned, any manifest declaring the name gets the grant.
#[test]
fn a_pinned_grant_is_its_manifests_alone() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let real = pack(t.path(), "a", "probe");
    let rogue = pack(t.path(), "b", "probe");
    let net = r#"{"name":"probe","description":"d","entry":"run.sh","sandbox":{"network":true}}"#;
    fs::write(&rogue, net).unwrap();
    let grant = |manifest: Option<PathBuf>| policy::SkillGrant {
        manifest,
        network: true,
        ..policy::SkillGrant::default()
    };
    let config = |g| Config {
        roots: vec![t.path().to_owned()],
        skills: [("probe".to_owned(), g)].into(),
        ..Config::default()
    };
    let open = config(grant(None));
    let plan = Plan::build(&open, &rogue, b"{}".to_vec(), &[]).unwrap();
    assert!(plan.granted.network, "unpinned: any manifest of the name");

    let pinned = config(grant(Some(fs::canonicalize(&real).unwrap())));
    assert!(Plan::build(&pinned, &real, b"{}".to_vec(), &[]).is_ok());
    let e = Plan::build(&pinned, &rogue, b"{}".to_vec(), &[]).unwrap_err();
    assert!(matches!(e, PlanError::NotPinned { .. }), "{e}");
    assert_eq!(e.outcome(), Outcome::Rejected);
    assert_eq!(e.skill(), Some("probe"), "the report names the skill");
    let text = e.to_string();
    assert!(text.contains("[skills.probe] manifest") && text.contains("/a/skill.json"), "{text}");
    // Even asking for nothing beyond the default box.
    fs::write(&rogue, r#"{"name":"probe","description":"d","entry":"run.sh"}"#).unwrap();
    assert!(matches!(
        Plan::build(&pinned, &rogue, b"{}".to_vec(), &[]),
        Err(PlanError::NotPinned { .. })
    ));

    // A pin through a symlinked folder names the same file.
    let link = t.path().join("link");
    std::os::unix::fs::symlink(t.path().join("a"), &link).unwrap();
    let via_link = config(grant(Some(link.join("skill.json"))));
    assert!(Plan::build(&via_link, &real, b"{}".to_vec(), &[]).is_ok());
}

/// The plan reads the file that was opened and placed under its root,
/// even when another manifest was renamed over its path since.
#[test]
fn a_located_manifest_is_the_one_planned() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = pack(t.path(), "a", "first");
    let other = pack(t.path(), "b", "second");
    let config = Config { roots: vec![t.path().to_owned()], ..Config::default() };
    let located = Located::open(&config.roots, &m).unwrap();
    assert_eq!(located.path(), fs::canonicalize(&m).unwrap());
    // Read once already (the server's check on a cache miss).
    let first = read_manifest(located.file()).unwrap();
    fs::rename(&other, &m).unwrap();
    assert_eq!(read_manifest(located.file()).unwrap(), first, "read from the start again");
    let plan = Plan::build_located(&config, located, None, b"{}".to_vec(), &[]).unwrap();
    assert_eq!(plan.manifest.name().as_str(), "first");
    let again = Plan::build(&config, &m, b"{}".to_vec(), &[]).unwrap();
    assert_eq!(again.manifest.name().as_str(), "second", "the path now names the other");
}

/// A manifest handed over already parsed is the one planned: the file
/// is neither read nor parsed again.
#[test]
fn a_manifest_parsed_by_the_check_is_not_parsed_again() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = pack(t.path(), "a", "on_disk");
    let config = Config { roots: vec![t.path().to_owned()], ..Config::default() };
    let opts = ValidateOptions { max_timeout: config.max_timeout() };
    let bytes = br#"{"name":"handed","description":"d","entry":"run.sh"}"#;
    let handed = Arc::new(parse_manifest(&m, bytes, None, &opts).unwrap());
    let located = Located::open(&config.roots, &m).unwrap().parsed_as(handed);
    let plan = Plan::build_located(&config, located, None, b"{}".to_vec(), &[]).unwrap();
    assert_eq!(plan.manifest.name().as_str(), "handed");
}

#[test]
fn located_under_a_root_or_its_own_folder() {
    let t = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let m = pack(t.path(), "a", "x");
    let err = Located::open(&[elsewhere.path().to_owned()], &m).unwrap_err();
    assert!(matches!(err, PlanError::OutsideRoots { .. }), "{err}");
    let err = Located::open(&[t.path().to_owned()], &t.path().join("a/missing.json"));
    assert!(matches!(err, Err(PlanError::Read { .. })), "{err:?}");
    // Every report of it says why (a one-shot run's reads the error alone).
    let text = err.unwrap_err().to_string();
    assert!(text.ends_with("cannot read: No such file or directory (os error 2)"), "{text}");
    // No roots: its own folder is its root.
    let at = Located::open(&[], &m).unwrap();
    assert_eq!(at.root, fs::canonicalize(t.path().join("a")).unwrap());
    assert_eq!(at.roots, vec![at.skill_dir.clone()]);
}

#[test]
fn manifest_bytes_stop_one_past_the_limit() {
    let t = tempfile::tempdir().unwrap();
    let big = t.path().join("big");
    fs::write(&big, vec![b' '; usize::try_from(MAX_MANIFEST_BYTES).unwrap() + 4096]).unwrap();
    let f = fs::File::open(&big).unwrap();
    let want = usize::try_from(MAX_MANIFEST_BYTES + 1).unwrap();
    assert_eq!(read_manifest(&f).unwrap().len(), want);
    let empty = t.path().join("empty");
    fs::write(&empty, b"").unwrap();
    assert!(read_manifest(&fs::File::open(&empty).unwrap()).unwrap().is_empty());
}
