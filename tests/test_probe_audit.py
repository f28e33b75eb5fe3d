"""The environment audit's parsers on strings, and collect_audit on a synthetic home and /etc and
on this real machine."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest

from gpuvet.facts import Audit
from gpuvet.probe import audit as audit_probe
from gpuvet.probe.audit import EMPTY, EXPRESSION, SET, ProcessView

ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
RSA = "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"


def files(tree: dict[str, str]):
    """read() and glob() over an in-memory file tree."""
    def read(path: str):
        return tree.get(path)

    def glob(pattern: str):
        return [path for path in tree if fnmatch.fnmatch(path, pattern)]
    return read, glob


# -- sshd_config ------------------------------------------------------------------------------

DEBIAN_SSHD = """\
# Debian/Ubuntu put the Include first, so the drop-ins win over later lines
Include /etc/ssh/sshd_config.d/*.conf

#PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
X11Forwarding yes

Match User deploy
    PasswordAuthentication yes
    AllowTcpForwarding no
Match all
GatewayPorts=clientspecified
"""


def test_sshd_first_value_wins_and_includes_come_in_at_their_place():
    read, glob = files({
        "/etc/ssh/sshd_config": DEBIAN_SSHD,
        "/etc/ssh/sshd_config.d/50-cloud-init.conf": "PasswordAuthentication yes\n",
        "/etc/ssh/sshd_config.d/10-root.conf": "permitrootlogin  Yes\nPasswordAuthentication no # in a later file\n",
    })
    sshd = audit_probe.parse_sshd_config("/etc/ssh/sshd_config", read, glob)
    # 10-root.conf sorts before 50-cloud-init.conf, and both come before the main file's lines.
    assert sshd["PasswordAuthentication"] == "no"
    assert sshd["PasswordAuthentication.at"] == "/etc/ssh/sshd_config.d/10-root.conf:2"
    assert sshd["PermitRootLogin"] == "Yes" and sshd["PermitRootLogin.at"].endswith("10-root.conf:1")
    assert sshd["KbdInteractiveAuthentication"] == "no" and sshd["UsePAM"] == "yes"
    assert sshd["GatewayPorts"] == "clientspecified"  # after `Match all`, and in Key=value form
    assert "AllowTcpForwarding" not in sshd  # only inside `Match User deploy`


def test_sshd_cloud_init_drop_in_turns_passwords_back_on():
    read, glob = files({"/etc/ssh/sshd_config": DEBIAN_SSHD,
                        "/etc/ssh/sshd_config.d/50-cloud-init.conf": "PasswordAuthentication yes\n"})
    sshd = audit_probe.parse_sshd_config("/etc/ssh/sshd_config", read, glob)
    assert sshd["PasswordAuthentication"] == "yes"
    assert sshd["PasswordAuthentication.at"] == "/etc/ssh/sshd_config.d/50-cloud-init.conf:1"


def test_sshd_relative_include_the_old_alias_and_a_missing_include():
    read, glob = files({"/etc/ssh/sshd_config": "Include extra/*.conf nothing-here.conf\nChallengeResponseAuthentication no\n",
                        "/etc/ssh/extra/a.conf": "ClientAliveInterval 60\n"})
    sshd = audit_probe.parse_sshd_config("/etc/ssh/sshd_config", read, glob)
    assert sshd["ClientAliveInterval"] == "60" and sshd["KbdInteractiveAuthentication"] == "no"


def test_sshd_include_loops_stop():
    read, glob = files({"/etc/ssh/sshd_config": "Include /etc/ssh/sshd_config\nPort 2222\n"})
    assert audit_probe.parse_sshd_config("/etc/ssh/sshd_config", read, glob)["Port"] == "2222"


# -- ssh_config (client) ------------------------------------------------------------------------

def test_ssh_client_options_for_every_host_only():
    read, glob = files({
        "/home/u/.ssh/config": "Host gpu-box\n    ServerAliveInterval 5\nHost dev* *\n    TCPKeepAlive no\n",
        "/etc/ssh/ssh_config": "Host *\n    ServerAliveInterval 30\n    TCPKeepAlive yes\n    ServerAliveCountMax 3\n",
    })
    client = audit_probe.parse_ssh_client_config(["/home/u/.ssh/config", "/etc/ssh/ssh_config"], read, glob, "/home/u/.ssh")
    assert client == {"TCPKeepAlive": "no", "TCPKeepAlive.at": "/home/u/.ssh/config:4",
                      "ServerAliveInterval": "30", "ServerAliveInterval.at": "/etc/ssh/ssh_config:2",
                      "ServerAliveCountMax": "3", "ServerAliveCountMax.at": "/etc/ssh/ssh_config:4"}


def test_ssh_client_lines_before_any_host_apply_everywhere():
    read, glob = files({"/c": "ServerAliveInterval=15\nHost x\nServerAliveInterval 99\n"})
    assert audit_probe.parse_ssh_client_config(["/c"], read, glob, "/")["ServerAliveInterval"] == "15"


# -- authorized_keys ----------------------------------------------------------------------------

AUTHORIZED_KEYS = f"""\
# laptop
ssh-ed25519 {ED25519} alice@laptop
command="echo hi, there",no-port-forwarding,no-X11-forwarding ssh-ed25519 {ED25519} backup job
restrict,pty ssh-rsa {RSA} ci
restrict,port-forwarding ssh-rsa {RSA} tunnel key
no-port-forwarding ssh-ed25519 {ED25519}
this line is not a key
"""


def test_authorized_keys_with_and_without_options():
    keys = audit_probe.parse_authorized_keys(AUTHORIZED_KEYS)
    assert [(k["line"], k["type"], k["comment"], k["restricted"]) for k in keys] == [
        ("2", "ssh-ed25519", "alice@laptop", "no"),
        ("3", "ssh-ed25519", "backup job", "yes"),
        ("4", "ssh-rsa", "ci", "yes"),
        ("5", "ssh-rsa", "tunnel key", "no"),  # restrict, then forwarding re-enabled
        ("6", "ssh-ed25519", "", "no"),  # X11 forwarding still allowed
    ]
    assert keys[0]["options"] == ""
    assert keys[1]["options"] == 'command="echo hi, there",no-port-forwarding,no-X11-forwarding'


def test_option_names_ignore_commas_inside_quotes_and_case():
    names = audit_probe.option_names('command="a,b",No-Port-Forwarding,from="10.0.0.0/8,192.168.0.0/16"')
    assert names == {"command", "no-port-forwarding", "from"}


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")
def test_fingerprint_matches_ssh_keygen(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "synthetic", "-f", str(tmp_path / "k")], check=True)
    public = (tmp_path / "k.pub").read_text()
    expected = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True,
                              check=True).stdout.split()[1]
    (key,) = audit_probe.parse_authorized_keys(public)
    assert key["fingerprint"] == expected and key["comment"] == "synthetic"


# -- Jupyter configuration ------------------------------------------------------------------

JUPYTER_PY = """\
c = get_config()  # noqa
# c.ServerApp.token = 'commented out'
c.ServerApp.token = ''
c.ServerApp.ip = '0.0.0.0'  # every interface
c.NotebookApp.iopub_data_rate_limit = 10000000
c.ServerApp.password = os.environ["JUPYTER_PASSWORD"]
c.ServerApp.root_dir = '/mnt/nfs/notebooks'
c.OtherApp.token = 'not ours'
c.ServerApp.open_browser = False
"""


def test_jupyter_py_config_without_ever_keeping_a_secret():
    found = audit_probe.parse_jupyter_py(JUPYTER_PY, "/h/.jupyter/jupyter_server_config.py")
    assert found["ServerApp.token"] == EMPTY and found["ServerApp.token.at"] == "/h/.jupyter/jupyter_server_config.py:3"
    assert found["ServerApp.ip"] == "0.0.0.0"
    assert found["NotebookApp.iopub_data_rate_limit"] == "10000000"
    assert found["ServerApp.password"] == EXPRESSION
    assert found["ServerApp.root_dir"] == "/mnt/nfs/notebooks"
    assert "OtherApp.token" not in found and "ServerApp.open_browser" not in found


def test_jupyter_json_config_keeps_only_whether_a_password_is_set():
    text = '{"IdentityProvider": {"hashed_password": "argon2:$argon2id$v=19$secret"}, "ServerApp": {"token": "abc123", "ip": "127.0.0.1"}}'
    found = audit_probe.parse_jupyter_json(text, "/h/.jupyter/jupyter_server_config.json")
    assert found["IdentityProvider.hashed_password"] == SET and found["ServerApp.token"] == SET
    assert found["ServerApp.ip"] == "127.0.0.1"
    assert "argon2" not in str(found) and "abc123" not in str(found)


def test_jupyter_files_later_override_earlier_and_user_beats_system():
    paths = audit_probe.jupyter_config_files("/h/.jupyter", ["/usr/local/etc/jupyter", "/etc/jupyter"])
    assert paths.index("/etc/jupyter/jupyter_server_config.py") < paths.index("/h/.jupyter/jupyter_server_config.py")
    assert paths.index("/h/.jupyter/jupyter_server_config.py") < paths.index("/h/.jupyter/jupyter_server_config.json")
    read, _ = files({"/etc/jupyter/jupyter_server_config.py": "c.ServerApp.token = 'system'\n",
                     "/h/.jupyter/jupyter_server_config.json": '{"ServerApp": {"token": ""}}'})
    merged, present = audit_probe.read_jupyter_config(paths, read)
    assert merged["ServerApp.token"] == EMPTY and present == ["/etc/jupyter/jupyter_server_config.py",
                                                             "/h/.jupyter/jupyter_server_config.json"]


def test_jupyter_command_line_options():
    cli = audit_probe.jupyter_cli_options(["/usr/bin/python3", "/usr/local/bin/jupyter-lab", "--ip=0.0.0.0", "--port", "8890",
                                           "--ServerApp.token=", "--no-browser", "--notebook-dir=/data",
                                           "--NotebookApp.password='sha1:abc'", "--ServerApp.iopub_data_rate_limit=1e10"])
    assert cli == {"ServerApp.ip": "0.0.0.0", "ServerApp.port": "8890", "ServerApp.token": EMPTY,
                   "ServerApp.root_dir": "/data", "NotebookApp.password": SET, "ServerApp.iopub_data_rate_limit": "1e10"}


@pytest.mark.parametrize("cli, env, config, protected, words", [
    ({"ServerApp.token": EMPTY}, {}, {}, False, "token disabled"),
    ({"ServerApp.token": SET}, {}, {"ServerApp.token": EMPTY}, True, "token set"),
    ({}, {"JUPYTER_TOKEN": SET}, {"ServerApp.token": EMPTY}, True, "JUPYTER_TOKEN"),
    ({}, {}, {"ServerApp.token": EMPTY, "ServerApp.token.at": "/h/c.py:3"}, False, "/h/c.py:3"),
    ({}, {}, {"ServerApp.token": EMPTY, "IdentityProvider.hashed_password": SET}, True, "hashed_password set"),
    ({"NotebookApp.token": EMPTY}, {}, {}, False, "NotebookApp.token on the command line"),
    ({}, {}, {"ServerApp.token": EXPRESSION}, None, "cannot tell"),
    ({}, {}, {}, True, "random one"),
    ({}, {"JUPYTER_TOKEN": EMPTY}, {}, True, "random one"),  # empty is unset to Jupyter: it makes a token
])
def test_jupyter_protection(cli, env, config, protected, words):
    verdict, how = audit_probe.jupyter_protection(cli, env, config, ["jupyter-lab"])
    assert verdict is protected and words in how


def test_jupyterhub_single_user_servers_are_protected_by_the_hub():
    verdict, how = audit_probe.jupyter_protection({"ServerApp.token": EMPTY}, {}, {}, ["/opt/bin/jupyterhub-singleuser"])
    assert verdict is True and "JupyterHub" in how


# -- listeners (psutil.net_connections-like tuples) ----------------------------------------------

addr = namedtuple("addr", "ip port")
sconn = namedtuple("sconn", "fd family type laddr raddr status pid")

PROCESSES = {
    100: ProcessView("jupyter-lab", ["/usr/bin/python3", "/usr/local/bin/jupyter-lab", "--ip=0.0.0.0", "--ServerApp.token=",
                                     "--allow-root"], cwd="/root", env={}),
    200: ProcessView("tensorboard", ["/usr/bin/python3", "/usr/local/bin/tensorboard", "--logdir", "runs", "--bind_all"]),
    300: ProcessView("sshd", ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"]),
    400: ProcessView("python3", ["python3", "-m", "http.server", "8888"]),
    500: ProcessView("systemd", ["/sbin/init"]),
    600: ProcessView("python", ["/opt/conda/bin/python", "-m", "jupyterlab", "--no-browser"], env={"JUPYTER_TOKEN": SET}),
}


def listeners(*conns, config=None):
    return audit_probe.listeners_from(conns, PROCESSES.get, config or {})


def test_listeners_kinds_exposure_and_protection():
    found = listeners(
        sconn(3, 2, 1, addr("0.0.0.0", 8888), (), "LISTEN", 100),
        sconn(4, 10, 1, addr("::", 8888), (), "LISTEN", 100),
        sconn(5, 2, 1, addr("0.0.0.0", 6006), (), "LISTEN", 200),
        sconn(6, 2, 1, addr("0.0.0.0", 22), (), "LISTEN", 300),
        sconn(7, 2, 1, addr("127.0.0.1", 8889), (), "LISTEN", 400),
        sconn(8, 2, 1, addr("10.0.0.5", 8890), (), "LISTEN", 600),
        sconn(9, 2, 1, addr("10.0.0.5", 22), addr("10.0.0.9", 50000), "ESTABLISHED", 300),
    )
    summary = [(item.address, item.port, item.kind, item.all_interfaces, item.protected) for item in found]
    assert summary == [
        ("0.0.0.0", 22, "ssh", True, True),
        ("0.0.0.0", 6006, "tensorboard", True, False),
        ("0.0.0.0", 8888, "jupyter", True, False),
        ("::", 8888, "jupyter", True, False),
        ("127.0.0.1", 8889, "file-server", False, False),  # http.server on a Jupyter port is not taken for Jupyter
        ("10.0.0.5", 8890, "jupyter", False, True),
    ]
    jupyter = found[2]
    assert jupyter.pid == 100 and jupyter.process == "jupyter-lab" and "token disabled" in jupyter.note
    assert "JUPYTER_TOKEN" in found[5].note


def test_file_servers_name_the_folder_and_credentialed_daemons_count_as_protected():
    views = {1: ProcessView("python3", ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"], cwd="/root"),
             2: ProcessView("python3", ["python3", "-m", "http.server", "-d", "data"], cwd="/srv"),
             3: ProcessView("kubelet", ["/usr/bin/kubelet"]),
             4: ProcessView("node", ["node", "server.js"]),
             5: ProcessView("dropbear", ["dropbear", "-F"])}
    found = audit_probe.listeners_from([sconn(3, 2, 1, addr("0.0.0.0", 8000 + pid), (), "LISTEN", pid) for pid in views],
                                       views.get, {})
    by_pid = {item.pid: item for item in found}
    assert (by_pid[1].kind, by_pid[1].protected, by_pid[1].note) == ("file-server", False, "serves every file under /root")
    assert by_pid[2].note == "serves every file under /srv/data"
    assert by_pid[3].protected is True and "TLS client certificates" in by_pid[3].note
    assert (by_pid[4].kind, by_pid[4].protected) == (None, None)  # unknown: the judge warns about it
    assert (by_pid[5].kind, by_pid[5].protected) == ("ssh", True)


def test_listeners_whose_process_cannot_be_read_are_recognised_by_port():
    found = listeners(sconn(3, 2, 1, addr("0.0.0.0", 8888), (), "LISTEN", None),
                      sconn(4, 2, 1, addr("0.0.0.0", 8265), (), "LISTEN", 999),
                      sconn(5, 2, 1, addr("0.0.0.0", 22), (), "LISTEN", 500),
                      sconn(6, 2, 1, addr("0.0.0.0", 5432), (), "LISTEN", None))
    by_port = {item.port: item for item in found}
    assert by_port[8888].kind == "jupyter" and by_port[8888].protected is None and "port only" in by_port[8888].note
    assert by_port[8265].kind == "ray-dashboard" and by_port[8265].protected is False
    assert by_port[22].kind == "ssh" and "systemd" in by_port[22].note  # socket activation
    assert by_port[5432].kind is None and by_port[5432].note is None


def test_jupyter_settings_command_line_over_config_and_working_directory_as_root():
    config = {"NotebookApp.iopub_data_rate_limit": "10000000", "NotebookApp.iopub_data_rate_limit.at": "/h/c.py:5"}
    found = listeners(sconn(3, 2, 1, addr("0.0.0.0", 8888), (), "LISTEN", 100))
    settings = audit_probe.jupyter_settings(config, [(found[0], PROCESSES[100])])
    assert settings["running"] == "yes" and "pid 100" in settings["server"]
    assert settings["iopub_data_rate_limit"] == "10000000" and settings["iopub_data_rate_limit.at"] == "/h/c.py:5"
    assert settings["root_dir"] == "/root" and settings["root_dir.at"] == "the server's working directory"
    cli_view = ProcessView("jupyter-lab", ["jupyter-lab", "--ServerApp.iopub_data_rate_limit=1e10", "--notebook-dir=/data"])
    settings = audit_probe.jupyter_settings(config, [(found[0], cli_view)])
    assert settings["iopub_data_rate_limit"] == "1e10" and settings["iopub_data_rate_limit.at"] == "command line"
    assert settings["root_dir"] == "/data"


def test_jupyter_settings_from_config_alone():
    settings = audit_probe.jupyter_settings({"ServerApp.root_dir": "/mnt/nfs/nb", "ServerApp.root_dir.at": "/h/c.py:7"}, [])
    assert settings == {"running": "no", "root_dir": "/mnt/nfs/nb", "root_dir.at": "/h/c.py:7"}


def test_environment_keeps_values_but_never_secrets():
    env = audit_probe.environment_of({"CUDA_MODULE_LOADING": "EAGER", "CUDA_VISIBLE_DEVICES": "0,1", "JUPYTER_TOKEN": "hunter2",
                                      "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "x"})
    assert env == {"CUDA_MODULE_LOADING": "EAGER", "CUDA_VISIBLE_DEVICES": "0,1", "JUPYTER_TOKEN": SET}


# -- collect_audit -------------------------------------------------------------------------------

def synthetic_system(tmp_path: Path) -> tuple[Path, Path]:
    """A made-up home and /etc with one of everything the audit reads."""
    home, etc = tmp_path / "home", tmp_path / "etc"
    (home / ".ssh").mkdir(parents=True)
    (home / ".jupyter").mkdir()
    (etc / "ssh" / "sshd_config.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host *\n  ServerAliveInterval 30\n")
    (home / ".ssh" / "authorized_keys").write_text(AUTHORIZED_KEYS)
    (home / ".jupyter" / "jupyter_server_config.py").write_text(JUPYTER_PY)
    (etc / "ssh" / "sshd_config").write_text(DEBIAN_SSHD)  # its Include names /etc/ssh/...: read under etc
    (etc / "ssh" / "sshd_config.d" / "50-cloud-init.conf").write_text("PasswordAuthentication yes\n")
    return home, etc


def test_collect_audit_on_a_synthetic_home_and_etc(tmp_path):
    home, etc = synthetic_system(tmp_path)
    audit = audit_probe.collect_audit(str(home), str(etc), environ={"CUDA_MODULE_LOADING": "EAGER", "JUPYTER_TOKEN": "s3cret"})
    assert audit.ssh_client["ServerAliveInterval"] == "30"
    assert audit.sshd["PasswordAuthentication"] == "yes"
    assert audit.sshd["PasswordAuthentication.at"] == f"{etc}/ssh/sshd_config.d/50-cloud-init.conf:1"
    assert [k["restricted"] for k in audit.authorized_keys] == ["no", "yes", "yes", "no", "no"]
    assert audit.jupyter["ServerApp.token"] == EMPTY
    assert audit.jupyter["config_files"] == f"{home}/.jupyter/jupyter_server_config.py"
    assert audit.jupyter["root_dir"] == "/mnt/nfs/notebooks" and audit.jupyter["root_dir.kind"]
    assert audit.environment == {"CUDA_MODULE_LOADING": "EAGER", "JUPYTER_TOKEN": SET}
    assert "s3cret" not in str(audit)
    assert "sshd" not in audit.unavailable and "authorized_keys" not in audit.unavailable


def test_collect_audit_on_an_empty_home_says_what_is_missing(tmp_path):
    audit = audit_probe.collect_audit(str(tmp_path / "nobody"), str(tmp_path / "etc"), environ={})
    assert audit.ssh_client == {} and audit.sshd == {} and audit.authorized_keys == []
    assert audit.unavailable["sshd"].startswith(f"no {tmp_path}/etc/ssh/sshd_config")
    assert audit.unavailable["authorized_keys"] == f"no {tmp_path}/nobody/.ssh/authorized_keys"
    assert audit.jupyter["config_files"] == ""


def test_collect_audit_survives_unreadable_parts(tmp_path, monkeypatch):
    home, etc = synthetic_system(tmp_path)

    def broken():
        raise PermissionError(13, "Permission denied", "/proc/net/tcp")
    monkeypatch.setattr(audit_probe, "_net_connections", broken)
    (home / ".ssh" / "config").unlink()
    (home / ".ssh" / "config").mkdir()  # a directory where a file should be
    audit = audit_probe.collect_audit(str(home), str(etc), environ={})
    assert audit.unavailable["listeners"] == "permission denied: /proc/net/tcp"
    assert audit.ssh_client == {}
    assert audit.sshd["PasswordAuthentication"] == "yes"  # the other parts still report


def test_collect_audit_on_this_machine_never_raises():
    audit = audit_probe.collect_audit()
    assert isinstance(audit, Audit)
    assert all(item.port > 0 and isinstance(item.all_interfaces, bool) for item in audit.listeners)
    assert audit.jupyter["running"] in ("yes", "no")
    assert set(audit.unavailable) <= {"ssh_client", "sshd", "authorized_keys", "jupyter", "listeners",
                                      "jupyter.settings", "environment"}


def test_an_audit_survives_the_run_record_round_trip(tmp_path):
    from gpuvet.facts import from_dict, to_dict

    home, etc = synthetic_system(tmp_path)
    audit = audit_probe.collect_audit(str(home), str(etc), environ={"CUDA_MODULE_LOADING": "LAZY"})
    audit.listeners = listeners(sconn(3, 2, 1, addr("0.0.0.0", 8888), (), "LISTEN", 100))
    assert from_dict(Audit, to_dict(audit)) == audit


def _venv(root: Path, packages: dict[str, str], enabled: str | None = None) -> Path:
    """A server's own environment laid out as pip leaves it: dist-info folders and config.d files."""
    site = root / "lib" / "python3.12" / "site-packages"
    for name, version in packages.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
    if enabled:
        conf = root / "etc" / "jupyter" / "jupyter_server_config.d"
        conf.mkdir(parents=True)
        (conf / f"{enabled}.json").write_text('{"ServerApp": {"jpserver_extensions": {"%s": true}}}' % enabled)
    return root


def test_a_jupyter_server_2_ignores_the_notebook_app_rate_limit(tmp_path):
    prefix = _venv(tmp_path / "venv", {"jupyter_server": "2.21.0", "jupyterlab": "4.4.0"})
    view = ProcessView("jupyter-lab", [f"{prefix}/bin/python", f"{prefix}/bin/jupyter-lab"], "/root", {}, "/usr/bin/python3.12")
    assert audit_probe.server_prefix(view) == str(prefix)
    packages = audit_probe.installed_packages(str(prefix), lambda pattern: [str(p) for p in Path("/").glob(pattern.lstrip("/"))])
    assert packages == {"jupyter_server": "2.21.0", "jupyterlab": "4.4.0"}
    config = {"NotebookApp.iopub_data_rate_limit": "10000000", "NotebookApp.iopub_data_rate_limit.at": "/h/c.py:5"}
    found = listeners(sconn(3, 2, 1, addr("0.0.0.0", 8888), (), "LISTEN", 100))
    settings = audit_probe.jupyter_settings(config, [(found[0], view)], packages)
    assert "iopub_data_rate_limit" not in settings and "ignores NotebookApp" in settings["notebook_app_ignored"]
    classic = ProcessView("jupyter-notebook", [f"{prefix}/bin/jupyter-notebook"])
    assert audit_probe.jupyter_settings(config, [(found[0], classic)], {"jupyter_server": "2.21.0", "notebook": "6.5.7"}
                                        )["iopub_data_rate_limit"] == "10000000"  # the classic Notebook reads it


def test_a_resource_monitor_in_the_servers_own_environment_is_found(tmp_path):
    prefix = _venv(tmp_path / "venv", {"jupyter_server": "2.21.0", "jupyter_resource_usage": "1.1.1"},
                   enabled="jupyter_resource_usage")
    audit = Audit()

    def read(path: str) -> str | None:
        return Path(path).read_text() if Path(path).is_file() else None

    audit_probe.server_resource_monitors(audit, str(prefix), {"jupyter_resource_usage": "1.1.1"},
                                          lambda pattern: [str(p) for p in Path("/").glob(pattern.lstrip("/"))], read)
    assert audit.jupyter["resource_monitors"].startswith("jupyter_resource_usage (")
