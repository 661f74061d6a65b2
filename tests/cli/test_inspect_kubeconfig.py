"""Finding and reading the kubeconfig as kubectl does (``gpupool.kube.kubeconfig``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.kube.kubeconfig import ANONYMOUS, KubeconfigError, load


def config(server: str = "https://one.example:6443", *, name: str = "one",
           current: str | None = "one", namespace: str | None = None,
           cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "contexts": [{"name": name, "context": context}],
        "users": [{"name": name, "user": user or {"token": f"token-{name}"}}]}
    if current:
        doc["current-context"] = current
    return doc


def write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def server_of(loaded: Any) -> str:
    return str(loaded.config.get().cluster.server)


def test_an_explicit_file_gives_its_current_context_and_namespace(tmp_path: Path) -> None:
    path = write(tmp_path / "k", config(namespace="team-a"))
    loaded = load(str(path), env={})
    assert (loaded.context, loaded.namespace, loaded.source) == ("one", "team-a",
                                                                  f"kubeconfig {path}")
    assert server_of(loaded) == "https://one.example:6443"
    assert loaded.config.get().user.token == "token-one"


def test_without_a_namespace_the_context_uses_default(tmp_path: Path) -> None:
    assert load(str(write(tmp_path / "k", config())), env={}).namespace == "default"


def test_kubeconfig_list_is_merged_first_definition_and_first_current_context_win(
        tmp_path: Path) -> None:
    first = config("https://first.example", name="shared", current=None)
    first["clusters"].append({"name": "only-second-context-uses-me",
                              "cluster": {"server": "https://from-first.example"}})
    second = config("https://second.example", name="shared", current="two")
    second["contexts"].append({"name": "two", "context": {
        "cluster": "only-second-context-uses-me", "user": "shared", "namespace": "ns2"}})
    second["clusters"].append({"name": "only-second-context-uses-me",
                               "cluster": {"server": "https://from-second.example"}})
    a, b = write(tmp_path / "a", first), write(tmp_path / "b", second)
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "absent"), str(a), str(b), str(a)])}
    loaded = load(env=env, home=tmp_path / "home")
    assert (loaded.context, loaded.namespace) == ("two", "ns2")
    assert server_of(loaded) == "https://from-first.example"  # the first file's cluster
    assert loaded.config.get().user.token == "token-shared"
    assert loaded.source == f"KUBECONFIG {a}, {b}"
    assert server_of(load(context="shared", env=env)) == "https://first.example"


def test_relative_files_are_taken_from_the_folder_of_their_kubeconfig(tmp_path: Path) -> None:
    folder = tmp_path / "certs-here"
    write(folder / "ca.crt", "not checked here")
    write(folder / "token", "secret")
    path = write(folder / "config", config(cluster={"certificate-authority": "ca.crt"},
                                           user={"tokenFile": "token"}))
    single = load(str(path), env={}).config.get()
    assert single.cluster.certificate_auth == str(folder / "ca.crt")
    assert single.user.token_file == str(folder / "token")


def test_home_config_is_used_when_kubeconfig_is_not_set(tmp_path: Path) -> None:
    write(tmp_path / ".kube" / "config", config("https://home.example"))
    loaded = load(env={}, home=tmp_path)
    assert server_of(loaded) == "https://home.example"
    assert loaded.source == f"kubeconfig {tmp_path / '.kube' / 'config'}"


def test_a_context_without_a_user_connects_without_credentials(tmp_path: Path) -> None:
    doc = config()
    del doc["contexts"][0]["context"]["user"]
    single = load(str(write(tmp_path / "k", doc)), env={}).config.get()
    assert single.context.user == ANONYMOUS and single.user is not None
    assert single.user.token is None and single.user.token_file is None


def test_inside_a_pod_the_service_account_is_used(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path / "serviceaccount"
    write(account / "token", "sa-token")
    write(account / "namespace", "gpupool-system")
    write(account / "ca.crt", "not checked here")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    loaded = load(env=dict(os.environ) | {"KUBECONFIG": ""}, home=tmp_path / "nohome",
                  service_account=account)
    assert server_of(loaded) == "https://10.0.0.1:443"
    assert loaded.namespace == "gpupool-system"
    assert loaded.source == f"service account in {account}"


NOT_YAML = "apiVersion: v1\nclusters:\n  - name: a\n   cluster: {}\n"


@pytest.mark.parametrize(("doc", "context", "words"), [
    (None, None, "{path}: no such file (check the path; without --kubeconfig, KUBECONFIG and "
                 "then ~/.kube/config are read, as kubectl does)"),
    (NOT_YAML, None, "{path}: not valid YAML (line 4, column 4: expected <block end>, but "
                     "found '<block mapping start>')"),
    ("- a\n- b\n", None, "{path}: not a kubeconfig (expected a map with clusters, contexts "
                         "and users, got a list)"),
    ("kind: Pod\nmetadata: {name: p}\n", None,
     "{path}: kind is 'Pod', not 'Config'; not a kubeconfig"),
    ("a: 1\n", None, "{path}: not a kubeconfig (no clusters, contexts or users)"),
    ({**config(), "clusters": {"one": {}}}, None, "{path}: clusters must be a list, got a map"),
    ({**config(), "users": [{"user": {}}]}, None, "{path}: users entry 1 has no name"),
    (config(current=None), None, "{path}: no current context is set (pick one with --context "
                                 "NAME or kubectl config use-context NAME)"),
    (config(current="two"), None, "{path}: context 'two' (current-context in {path}) does not "
                                  "exist (known: one)"),
    (config(), "three", "{path}: context 'three' (--context) does not exist (known: one)"),
    ({**config(), "clusters": []}, None, "{path}: context 'one' names cluster 'one', which "
                                         "is not defined"),
    ({**config(), "users": []}, None, "{path}: context 'one' names user 'one', which is not "
                                      "defined"),
    (config(server=""), None, "{path}: cluster 'one' has no server"),
    (config(server="one.example:6443"), None,
     "{path}: cluster 'one': server 'one.example:6443' is not an http:// or https:// URL"),
    (config(cluster={"insecure-skip-tls-verify": "yes"}), None,
     "{path}: cluster 'one': Expected bool, got str - at $.insecure-skip-tls-verify"),
    (config(cluster={"certificate-authority": "missing-ca.crt"}), None,
     "{path}: certificate-authority {dir}/missing-ca.crt does not exist"),
    (config(user={"tokenFile": "/nonexistent/token"}), None,
     "{path}: tokenFile /nonexistent/token does not exist"),
    (config(user={"client-certificate-data": "!!not base64", "client-key-data": "eA=="}), None,
     "{path}: user 'one': client-certificate-data is not base64"),
])
def test_a_kubeconfig_that_is_not_usable_is_one_line_naming_the_file(
        tmp_path: Path, doc: Any, context: str | None, words: str) -> None:
    path = tmp_path / "kubeconfig"
    if doc is not None:
        write(path, doc)
    with pytest.raises(KubeconfigError) as err:
        load(str(path), context, env={})
    message = str(err.value)
    assert message == f"kubeconfig {words.format(path=path, dir=tmp_path)}"
    assert "\n" not in message


def test_a_folder_given_as_kubeconfig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=f"^kubeconfig {tmp_path}: not a file$"):
        load(str(tmp_path), env={})


def test_a_broken_file_in_the_kubeconfig_list_is_named(tmp_path: Path) -> None:
    good = write(tmp_path / "good", config())
    bad = write(tmp_path / "bad", NOT_YAML)
    with pytest.raises(KubeconfigError, match=f"^kubeconfig {bad}: not valid YAML"):
        load(env={"KUBECONFIG": os.pathsep.join([str(good), str(bad)])})


@pytest.mark.parametrize(("env", "words"), [
    ({}, "KUBECONFIG is not set and {home}/.kube/config does not exist"),
    ({"KUBECONFIG": "{home}/a:{home}/b"}, "none of the files KUBECONFIG lists exists "
                                          "({home}/a, {home}/b)"),
])
def test_no_configuration_anywhere_says_what_was_tried(
        tmp_path: Path, env: dict[str, str], words: str) -> None:
    env = {k: v.format(home=tmp_path) for k, v in env.items()}
    with pytest.raises(KubeconfigError) as err:
        load(env=env, home=tmp_path, service_account=tmp_path / "no-account")
    assert str(err.value) == (f"no Kubernetes configuration: {words.format(home=tmp_path)}, "
                              "and this is not a pod with a service account (give "
                              "--kubeconfig FILE)")
