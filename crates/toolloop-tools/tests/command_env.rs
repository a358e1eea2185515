//! The child of `run_command` does not see credentials from the environment. (A file of its
//! own: it sets environment variables, which no other test of this binary reads.)
#![cfg(unix)]

use serde_json::json;
use toolloop::tool::{Tool, ToolContext};
use toolloop_tools::command::{CommandConfig, RunCommand};

#[tokio::test]
async fn keys_are_absent_from_the_childs_environment() {
    let secrets = [
        ("OPENAI_API_KEY", "sk-test-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("GITHUB_TOKEN", "ghp_test"),
        ("MY_SECRET_SAUCE", "saucy"),
        ("DB_PASSWORD", "hunter2"),
        ("TOOLLOOP_STORE", "postgres://u:pw@h/db"),
        ("APIKEY", "plain-apikey"),
        ("https_proxy", "http://user:proxypass@proxy.example:3128"),
        ("MIRROR", "https://mirror.example/x?token=urltoken"),
        ("TOOLLOOP_MARKED_FOR_TEST", "marked-value"),
    ];
    toolloop::redact::mark_secret_env_name("TOOLLOOP_MARKED_FOR_TEST");
    // SAFETY: this test binary has this one test; nothing else reads the environment meanwhile.
    unsafe {
        for (k, v) in secrets {
            std::env::set_var(k, v);
        }
        std::env::set_var("TOOLLOOP_HARMLESS", "visible");
        std::env::set_var("no_proxy", "localhost");
    }
    let dir = tempfile::tempdir().unwrap();
    let t = RunCommand::new(CommandConfig::new(dir.path())).unwrap();
    let out = t
        .call(
            json!({"command": ["printenv"]}),
            ToolContext::detached("c", "run_command"),
        )
        .await
        .unwrap();
    let env = out.data.unwrap()["stdout"].as_str().unwrap().to_string();
    assert!(env.contains("TOOLLOOP_HARMLESS=visible"), "{env}");
    assert!(env.contains("PATH="));
    assert!(env.contains("no_proxy=localhost"), "{env}");
    for (k, v) in secrets {
        assert!(!env.contains(k), "{k} reached the child");
        assert!(!env.contains(v), "{k}'s value reached the child");
    }
}
