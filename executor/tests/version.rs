//! `ongrid-executor -V` and `--version`: the name and version, exit 0.

#[test]
fn the_executor_answers_its_version() {
    let expected = format!("ongrid-executor {}", env!("CARGO_PKG_VERSION"));
    for flag in ["-V", "--version"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
            .arg(flag)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected, "{flag}");
    }
}
