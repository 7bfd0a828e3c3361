"""No key or password in a file other users can read: the credentials, the NATS configuration and the effective
cluster config `janus up` writes (the gateway's API keys are in it) are 0600, even where an older file was 0644."""
from __future__ import annotations

import stat

from runtime.security import load_or_create_credentials, write_nats_config, write_private


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secret_files_are_private_even_when_an_older_one_was_not(tmp_path):
    for name in ("credentials.json", "nats.conf", "other"):
        (tmp_path / name).write_text("old")
        (tmp_path / name).chmod(0o644)
    (tmp_path / "credentials.json").write_text("{}")  # incomplete: written anew
    creds = load_or_create_credentials(tmp_path / "credentials.json")
    write_nats_config(tmp_path / "nats.conf", creds)
    write_private(tmp_path / "other", "secret")
    for name in ("credentials.json", "nats.conf", "other"):
        assert _mode(tmp_path / name) == 0o600, name
    assert creds["gateway"] in (tmp_path / "nats.conf").read_text()


def test_janus_up_writes_the_effective_config_with_its_api_keys_private(tmp_path):
    from ops.launcher import Cluster
    from runtime.settings import ClusterConfig, JanusSettings

    cluster = ClusterConfig.model_validate({"gateway": {"api_keys": {"sk-very-secret": "tenant-a"}}})
    (tmp_path / "cluster.effective.yaml").write_text("old")
    (tmp_path / "cluster.effective.yaml").chmod(0o644)
    up = Cluster(JanusSettings(state_dir=tmp_path), cluster, config_path=None)
    assert "sk-very-secret" in up.config_path.read_text()  # the gateway reads its keys from here
    for path in (up.config_path, tmp_path / "credentials.json", tmp_path / "nats.conf"):
        assert _mode(path) == 0o600, path.name
