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
    let offered = ToolSet::of(weather, &config).definitions().count();
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
