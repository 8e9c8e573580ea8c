//! The shipped configs are valid: the example `proxy.yaml` and the configs
//! embedded in the Kubernetes ConfigMaps under `deploy/`.

use std::path::Path;

use agent_proxy::agent::toolset::ToolSet;
use agent_proxy::config::Config;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_example_proxy_yaml_loads_without_any_environment() {
    let text = std::fs::read_to_string(root().join("proxy.yaml")).unwrap();
    let config = Config::parse(&text, |_| None).unwrap_or_else(|e| panic!("proxy.yaml: {e}"));
    let ids: Vec<&str> = config.agents.keys().map(String::as_str).collect();
    assert_eq!(ids, ["coder", "docs", "helper", "team", "weather"]);
    assert!(config.router.is_some() && config.mcp_servers.contains_key("files"));
    assert!(
        config.api_keys.is_empty(),
        "without AGENT_PROXY_KEY, auth is off"
    );
    let weather = config.agent("weather").unwrap();
    let offered = ToolSet::of(weather, &config).functions().count();
    assert_eq!(
        offered, 1,
        "get_weather from both the agent and its skill, offered once"
    );
}

#[test]
fn every_configmap_under_deploy_holds_a_valid_config() {
    let mut checked = 0;
    for layout in ["sidecar", "standalone"] {
        let path = root()
            .join("deploy/kubernetes")
            .join(layout)
            .join("configmap.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let map: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        let embedded = map["data"]["proxy.yaml"]
            .as_str()
            .unwrap_or_else(|| panic!("{path:?} has no proxy.yaml"));
        // The secrets come from the environment in the cluster.
        let config = Config::parse(embedded, |_| Some("from-secret".into()))
            .unwrap_or_else(|e| panic!("{layout}: {e}"));
        assert_eq!(
            config.listen, "0.0.0.0:8787",
            "{layout}: a container must listen on all interfaces"
        );
        assert!(
            config.admin_listen.is_some(),
            "{layout}: probes and metrics use the admin port"
        );
        assert!(!config.api_keys.is_empty(), "{layout}: auth is on");
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// Runs `agent-proxy` with `args` and returns (exit code, stdout, stderr).
fn run(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-proxy"))
        .args(args)
        .output()
        .expect("run agent-proxy");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `yaml` written to a fresh file; its path.
fn config_file(name: &str, yaml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-proxy-configs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

const BROKEN: &str = r#"default_upstream: local
upstreams:
  local: { url: "http://127.0.0.1:8080/v1" }
skills:
  forecasting: { prompt: "Use Celsius." }
agents:
  weather:
    skills: [forecasting, nope]
"#;

#[test]
fn check_takes_the_config_as_a_plain_argument_too() {
    let example = root().join("proxy.yaml");
    let (code, stdout, stderr) = run(&["--check".as_ref(), example.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("proxy.yaml: OK (5 agents"), "{stdout}");
    let (code, _, stderr) = run(&["--check".as_ref(), "--config".as_ref(), example.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn check_names_the_file_line_and_key_and_what_was_expected() {
    let path = config_file("bad-reference.yaml", BROKEN);
    let (code, stdout, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(
        stderr,
        format!(
            "{}:8:27: agents.weather.skills[1]: no skill named `nope` (defined skills: forecasting)\n",
            path.display()
        )
    );

    let typo = BROKEN.replace(
        "    skills: [forecasting, nope]",
        "    skils: [forecasting]",
    );
    let path = config_file("unknown-key.yaml", &typo);
    let (code, _, stderr) = run(&["--check".as_ref(), "--config".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(2));
    let expected = format!(
        "{}:8:5: agents.weather.skils: unknown field `skils`, expected one of `name`, `description`",
        path.display()
    );
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(
        stderr.contains("`skills`"),
        "the expected keys are listed: {stderr}"
    );

    let path = config_file(
        "syntax.yaml",
        &BROKEN.replace("[forecasting, nope]", "[forecasting"),
    );
    let (code, _, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(2));
    let prefix = format!("{}:9:1: invalid YAML: ", path.display());
    assert!(stderr.starts_with(&prefix), "{stderr}");

    let path = config_file(
        "wrong-type.yaml",
        &format!("{BROKEN}    max_tool_rounds: many\n"),
    );
    let (code, _, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(2));
    let prefix = format!(
        "{}:9:5: agents.weather.max_tool_rounds: invalid type: string \"many\", expected u32",
        path.display()
    );
    assert!(stderr.starts_with(&prefix), "{stderr}");

    let missing = config_file("missing.yaml", "").with_file_name("no-such-file.yaml");
    let (code, _, stderr) = run(&["--check".as_ref(), missing.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.starts_with(&format!("{}: cannot read", missing.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A tool named as one of the proxy's functions would hide it, or be
    // hidden: memory's `remember`, an agent's `agent__<id>`.
    let reserved = [
        (
            "tools:\n  remember: { http: { url: \"http://127.0.0.1:9\" } }\n",
            "`remember`",
        ),
        (
            "tools:\n  agent__x: { http: { url: \"http://127.0.0.1:9\" } }\n",
            "`agent__x`",
        ),
        (
            "mcp_servers:\n  agent: { url: \"http://127.0.0.1:9/mcp\" }\n",
            "`agent` is taken",
        ),
    ];
    for (i, (extra, said)) in reserved.into_iter().enumerate() {
        let text = BROKEN.replace(", nope]", "]") + extra;
        let path = config_file(&format!("reserved-{i}.yaml"), &text);
        let (code, _, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
        assert_eq!(code, Some(2), "{extra}");
        assert!(stderr.contains(said), "{stderr}");
    }

    // A port `http` cannot read would have been port 80: a typo sent the
    // requests, and the upstream's key, elsewhere.
    let typo = BROKEN.replace("8080", "8O80").replace(", nope]", "]");
    let path = config_file("port-typo.yaml", &typo);
    let (code, _, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("upstreams.local") && stderr.contains("invalid port `8O80`"),
        "{stderr}"
    );

    // Credentials in a URL were sent nowhere: refused, and never shown.
    let userinfo = BROKEN
        .replace("127.0.0.1", "alice:hunter2@127.0.0.1")
        .replace(", nope]", "]");
    let mcp = BROKEN.replace(", nope]", "]")
        + "mcp_servers:\n  m: { url: \"http://alice:hunter2@127.0.0.1:9/mcp\" }\n";
    for (name, text) in [("userinfo.yaml", userinfo), ("mcp-userinfo.yaml", mcp)] {
        let path = config_file(name, &text);
        let (code, _, stderr) = run(&["--check".as_ref(), path.as_os_str()]);
        assert_eq!(code, Some(2), "{name}");
        assert!(
            stderr.contains("carries credentials") && stderr.contains("alice:***@127.0.0.1"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}
