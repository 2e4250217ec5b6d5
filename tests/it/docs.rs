//! The README's configuration examples parse as what they claim to be.

fn toml_blocks(text: &str) -> Vec<String> {
    text.split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_owned())
        .collect()
}

#[test]
fn every_toml_example_in_the_readme_is_a_valid_config() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let blocks = toml_blocks(&readme);
    assert!(
        blocks.len() >= 2,
        "the README shows an agent config and a relay config"
    );
    let dir = tempfile::tempdir().unwrap();
    for (i, block) in blocks.iter().enumerate() {
        let path = dir.path().join(format!("example{i}.toml"));
        std::fs::write(&path, block).unwrap();
        // Each block is an agent config or a relay config; one of them must accept it.
        let agent = mailslot::config::Config::load(&path);
        let relay = mailslot::relay::RelayConfig::load(&path);
        assert!(
            agent.is_ok() || relay.is_ok(),
            "example {i} parses as neither:\n{block}\nagent: {agent:?}\nrelay: {relay:?}"
        );
    }
}
