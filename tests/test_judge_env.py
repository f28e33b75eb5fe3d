"""env.* rules on synthetic audits (every Audit here is made up and named so), plus real GPU facts
from a capture where the CUDA driver version matters."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.facts import Audit, Driver, Gpu, Listener, Machine, Stack, Torch
from gpuvet.judge import env
from gpuvet.judge.common import Context
from gpuvet.probe import capture

FIXTURES = Path(__file__).parent / "fixtures"
RTX4090_X8_CUDA_12_2 = FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"

SYNTHETIC_SSHD_LISTENER = Listener("0.0.0.0", 22, pid=300, process="sshd", all_interfaces=True, kind="ssh", protected=True)
SYNTHETIC_KEY = {"line": "1", "type": "ssh-ed25519", "comment": "alice@laptop", "options": "", "restricted": "no",
                 "fingerprint": "SHA256:synthetic"}


def one(findings, check):
    (f,) = [f for f in findings if f.check == check]
    return f


def run(audit: Audit, machine: Machine | None = None):
    machine = machine or Machine()
    machine.audit = audit
    return env.check_environment(Context(machine))


def test_nothing_without_an_audit():
    assert env.check_environment(Context(Machine())) == []


def test_every_check_reports_once_on_an_empty_audit():
    checks = [f.check for f in run(Audit())]
    assert checks == ["env.exposed_servers", "env.ssh_login", "env.authorized_keys", "env.ssh_keepalive", "env.jupyter",
                      "env.cuda_module_loading"]


# -- env.exposed_servers ----------------------------------------------------------------------

def test_jupyter_without_token_on_all_interfaces_fails_with_the_closing_lines():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("0.0.0.0", 8888, pid=100, process="jupyter-lab", all_interfaces=True,
                                                kind="jupyter", protected=False, note="token disabled: empty ServerApp.token")])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "fail"
    assert "jupyter (jupyter-lab, pid 100) on 0.0.0.0:8888 has no login" in f.summary and "runs any code" in f.summary
    assert "c.ServerApp.ip = '127.0.0.1'" in f.remedy and "c.ServerApp.token" in f.remedy
    assert "ssh -N -L 8888:127.0.0.1:8888" in f.remedy
    assert "token disabled" in f.evidence.measured and "sshd_config(5)" in f.evidence.source


def test_jupyter_on_loopback_without_token_is_not_exposed():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("127.0.0.1", 8888, kind="jupyter", protected=False)])
    assert one(run(SYNTHETIC_AUDIT), "env.exposed_servers").status == "pass"


def test_a_server_bound_to_a_public_address_counts_as_exposed():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("10.0.0.5", 8265, kind="ray-dashboard", protected=False)])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "fail" and "--dashboard-host=127.0.0.1" in f.remedy


def test_tensorboard_exposed_warns_since_it_leaks_data_but_runs_no_code():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("::", 6006, kind="tensorboard", all_interfaces=True, protected=False)])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "warn" and "training logs" in f.summary and "--bind_all" in f.remedy


def test_jupyter_with_unknown_protection_warns():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("0.0.0.0", 8888, all_interfaces=True, kind="jupyter", protected=None,
                                                note="recognised by its port only (process not readable)")])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "warn" and "cannot tell" in f.summary


def test_protected_servers_and_loopback_ones_pass_with_the_list():
    SYNTHETIC_AUDIT = Audit(listeners=[
        Listener("0.0.0.0", 8888, all_interfaces=True, kind="jupyter", protected=True),
        SYNTHETIC_SSHD_LISTENER,
        Listener("0.0.0.0", 10250, pid=700, process="kubelet", all_interfaces=True, protected=True,
                 note="kubelet authenticates with TLS client certificates"),
        Listener("10.0.0.5", 5432, pid=800, process="postgres"),  # one address, not every interface
        Listener("127.0.0.53", 53, pid=900, process="systemd-resolved"),
        Listener("127.0.0.1", 6006, kind="tensorboard", protected=False)])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "pass" and "4 listening beyond loopback" in f.summary
    assert "ssh (sshd, pid 300) on 0.0.0.0:22" in f.evidence.measured and "5432" in f.evidence.measured
    assert "systemd-resolved" not in f.evidence.measured


def test_an_unknown_server_on_every_interface_warns_naming_process_port_and_fix():
    """The audit's gap: `python3 -m http.server 8000 --bind 0.0.0.0` passed as "no server without a login"."""
    SYNTHETIC_AUDIT = Audit(listeners=[SYNTHETIC_SSHD_LISTENER,
                                       Listener("0.0.0.0", 5000, pid=812, process="flask", all_interfaces=True),
                                       Listener("::", 5000, pid=812, process="flask", all_interfaces=True)])
    (f,) = [f for f in run(SYNTHETIC_AUDIT) if f.check == "env.exposed_servers"]  # one per server, not per socket
    assert f.status == "warn"
    assert "flask (pid 812) on 0.0.0.0:5000 listens on every interface" in f.summary
    assert "bound to 127.0.0.1" in f.remedy and "ssh -N -L 5000:127.0.0.1:5000" in f.remedy and "ufw" in f.remedy


def test_a_containers_published_port_says_how_to_publish_it_on_loopback():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("0.0.0.0", 8080, pid=90, process="docker-proxy", all_interfaces=True)])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "warn" and "a container's published port" in f.summary
    assert "docker run -p 127.0.0.1:8080:8080" in f.remedy


def test_a_python_file_server_on_every_interface_warns_with_the_folder_it_serves():
    SYNTHETIC_AUDIT = Audit(listeners=[Listener("0.0.0.0", 8000, pid=77, process="python3", all_interfaces=True,
                                                kind="file-server", protected=False, note="serves every file under /root")])
    f = one(run(SYNTHETIC_AUDIT), "env.exposed_servers")
    assert f.status == "warn" and "python3, pid 77) on 0.0.0.0:8000 has no login" in f.summary
    assert "serves every file under /root" in f.summary and "SSH keys" in f.summary
    assert "python3 -m http.server 8000 --bind 127.0.0.1" in f.remedy


def test_unreadable_listeners_skip():
    f = one(run(Audit(unavailable={"listeners": "permission denied: /proc/net/tcp"})), "env.exposed_servers")
    assert f.status == "skip" and "ss -ltnp" in f.remedy


# -- env.ssh_login ------------------------------------------------------------------------------

def test_password_login_by_sshd_default_warns_naming_the_default():
    SYNTHETIC_AUDIT = Audit(sshd={"KbdInteractiveAuthentication": "no", "KbdInteractiveAuthentication.at": "/etc/ssh/sshd_config:9"},
                            listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "warn" and "password logins are allowed (PasswordAuthentication)" in f.summary
    assert "PasswordAuthentication yes (not set: sshd's default)" in f.evidence.measured
    assert "KbdInteractiveAuthentication no (/etc/ssh/sshd_config:9)" in f.evidence.measured
    assert "PasswordAuthentication no" in f.remedy and "sshd -t" in f.remedy


def test_root_with_password_from_a_cloud_init_drop_in():
    SYNTHETIC_AUDIT = Audit(sshd={"PermitRootLogin": "yes", "PermitRootLogin.at": "/etc/ssh/sshd_config:33",
                                  "PasswordAuthentication": "yes",
                                  "PasswordAuthentication.at": "/etc/ssh/sshd_config.d/50-cloud-init.conf:1"},
                            listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "warn" and f.summary.startswith("root can log in with a password")
    assert "50-cloud-init.conf:1" in f.evidence.measured


def test_key_only_sshd_passes():
    SYNTHETIC_AUDIT = Audit(sshd={"PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no"},
                            listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "pass" and "need a key" in f.summary and "sshd is listening" in f.summary


def test_empty_passwords_fail_and_gateway_ports_are_named():
    SYNTHETIC_AUDIT = Audit(sshd={"PermitEmptyPasswords": "yes", "GatewayPorts": "yes"}, listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "fail" and "without a password can log in" in f.summary and "GatewayPorts" in f.summary


def test_a_stopped_sshd_with_passwords_warns_since_it_applies_the_moment_sshd_starts():
    SYNTHETIC_AUDIT = Audit(sshd={"PasswordAuthentication": "yes"}, listeners=[])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "warn" and "applies when sshd starts" in f.summary and f.remedy


def test_root_login_with_keys_only_warns_with_the_closing_line():
    SYNTHETIC_AUDIT = Audit(sshd={"PermitRootLogin": "yes", "PasswordAuthentication": "no",
                                  "KbdInteractiveAuthentication": "no"}, listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(SYNTHETIC_AUDIT), "env.ssh_login")
    assert f.status == "warn" and "root can log in (PermitRootLogin yes)" in f.summary
    assert "PermitRootLogin prohibit-password" in f.summary and "PermitRootLogin prohibit-password" in f.remedy


def test_no_sshd_config_skips():
    f = one(run(Audit(unavailable={"sshd": "no /etc/ssh/sshd_config (no OpenSSH server installed)"})), "env.ssh_login")
    assert f.status == "skip" and "no OpenSSH server installed" in f.summary


# -- env.authorized_keys ------------------------------------------------------------------------

def test_unrestricted_keys_warn_with_the_options_line():
    SYNTHETIC_AUDIT = Audit(authorized_keys=[SYNTHETIC_KEY, {**SYNTHETIC_KEY, "line": "2", "restricted": "yes", "comment": "ci"}])
    f = one(run(SYNTHETIC_AUDIT), "env.authorized_keys")
    assert f.status == "warn" and "1 of 2 authorized key(s)" in f.summary
    assert "line 1: ssh-ed25519 alice@laptop SHA256:synthetic" in f.evidence.measured
    assert "no-port-forwarding,no-X11-forwarding,no-agent-forwarding ssh-ed25519 AAAA" in f.remedy
    assert "AllowTcpForwarding local" in f.remedy


def test_all_keys_restricted_pass():
    f = one(run(Audit(authorized_keys=[{**SYNTHETIC_KEY, "restricted": "yes"}])), "env.authorized_keys")
    assert f.status == "pass" and "restricted" in f.summary


def test_no_keys_pass():
    f = one(run(Audit(unavailable={"authorized_keys": "no /root/.ssh/authorized_keys"})), "env.authorized_keys")
    assert f.status == "pass" and f.evidence.measured == "no /root/.ssh/authorized_keys"


def test_sshd_without_reverse_tunnels_makes_loose_keys_harmless():
    SYNTHETIC_AUDIT = Audit(authorized_keys=[SYNTHETIC_KEY], sshd={"AllowTcpForwarding": "local",
                                                                    "AllowTcpForwarding.at": "/etc/ssh/sshd_config:12"})
    f = one(run(SYNTHETIC_AUDIT), "env.authorized_keys")
    assert f.status == "pass" and "AllowTcpForwarding local, /etc/ssh/sshd_config:12" in f.summary


def test_unreadable_authorized_keys_skip():
    f = one(run(Audit(unavailable={"authorized_keys": "permission denied: /home/u/.ssh/authorized_keys"})), "env.authorized_keys")
    assert f.status == "skip"


# -- env.ssh_keepalive --------------------------------------------------------------------------

def test_no_keepalive_anywhere_warns_with_the_lines_to_add():
    f = one(run(Audit(sshd={"PasswordAuthentication": "no"}, listeners=[SYNTHETIC_SSHD_LISTENER])), "env.ssh_keepalive")
    assert f.status == "warn"
    assert "Host * / ServerAliveInterval 30 / ServerAliveCountMax 3 / TCPKeepAlive yes" in f.remedy
    assert "ClientAliveInterval 30" in f.remedy and "UseRoaming" not in f.remedy


def test_keepalive_of_this_machines_sshd_passes():
    assert one(run(Audit(sshd={"ClientAliveInterval": "60"})), "env.ssh_keepalive").status == "pass"


def test_this_machines_own_client_config_keeps_no_session_to_it_alive():
    # ~/.ssh/config here sets ServerAliveInterval for ssh *from* this machine; sshd's side is off.
    audit = Audit(ssh_client={"ServerAliveInterval": "30"}, sshd={"ClientAliveInterval": "0"},
                  listeners=[SYNTHETIC_SSHD_LISTENER])
    f = one(run(audit), "env.ssh_keepalive")
    assert f.status == "warn" and "only keeps ssh sessions from it" in f.summary


@pytest.mark.parametrize("audit", [
    Audit(unavailable={"sshd": "no /etc/ssh/sshd_config", "listeners": "permission denied"}),
    Audit(sshd={"PasswordAuthentication": "no"}, listeners=[]),  # installed, not running
])
def test_keepalive_without_a_running_ssh_server_is_advice_only(audit):
    f = one(run(audit), "env.ssh_keepalive")
    assert f.status == "skip" and "ServerAliveInterval 30" in f.remedy


# -- env.jupyter ------------------------------------------------------------------------------

def test_jupyter_with_the_default_rate_limit_warns_with_the_seed_line():
    SYNTHETIC_AUDIT = Audit(jupyter={"running": "yes", "server": "jupyter-lab pid 100 on 0.0.0.0:8888", "config_files": ""})
    (f,) = [f for f in run(SYNTHETIC_AUDIT) if f.check == "env.jupyter"]
    assert f.status == "warn" and "IOPub data rate exceeded" in f.summary
    assert "not set: Jupyter default" in f.evidence.measured and "1e+06" in f.evidence.measured
    assert "c.ServerApp.iopub_data_rate_limit = 10000000" in f.remedy


@pytest.mark.parametrize("settings", [{"iopub_data_rate_limit": "10000000"}, {"iopub_data_rate_limit": "1e10"},
                                      {"limit_rate": "False"}, {"iopub_data_rate_limit": "0"}])
def test_jupyter_with_a_raised_or_disabled_limit_passes(settings):
    SYNTHETIC_AUDIT = Audit(jupyter={"running": "yes", **settings})
    assert one(run(SYNTHETIC_AUDIT), "env.jupyter").status == "pass"


def test_notebook_directory_on_a_network_fs_warns():
    SYNTHETIC_AUDIT = Audit(jupyter={"running": "no", "config_files": "/h/.jupyter/jupyter_server_config.py",
                                     "iopub_data_rate_limit": "1e7", "root_dir": "/mnt/nfs/nb", "root_dir.at": "/h/c.py:7",
                                     "root_dir.kind": "network", "root_dir.fs_type": "nfs4"})
    found = [f for f in run(SYNTHETIC_AUDIT) if f.check == "env.jupyter"]
    assert [f.status for f in found] == ["pass", "warn"]
    assert "/mnt/nfs/nb is on a network file system (nfs4)" in found[1].summary and "root_dir" in found[1].remedy


def test_notebook_directory_in_the_containers_writable_layer_warns():
    SYNTHETIC_AUDIT = Audit(jupyter={"running": "yes", "iopub_data_rate_limit": "1e7", "root_dir": "/workspace",
                                     "root_dir.at": "the server's working directory", "root_dir.kind": "overlay",
                                     "root_dir.fs_type": "overlay",
                                     "root_dir.ephemeral": "container writable layer: deleted with the container"})
    found = [f for f in run(SYNTHETIC_AUDIT) if f.check == "env.jupyter"]
    assert [f.status for f in found] == ["pass", "warn"]
    assert "does not survive: container writable layer" in found[1].summary and "docker run -v" in found[1].remedy


def test_no_jupyter_skips_with_advice():
    f = one(run(Audit(jupyter={"running": "no", "config_files": ""})), "env.jupyter")
    assert f.status == "skip" and "iopub_data_rate_limit" in f.remedy


# -- env.cuda_module_loading -------------------------------------------------------------------

def gpu_machine(driver_cuda: str | None, torch: Torch | None = None) -> Machine:
    return Machine(driver=Driver(version="x", cuda_version=driver_cuda), gpus=[Gpu(index=0, name="NVIDIA A100-SXM4-80GB")],
                   stack=Stack(torch=torch or Torch()))


def test_eager_loading_warns():
    f = one(run(Audit(environment={"CUDA_MODULE_LOADING": "EAGER"}), gpu_machine("12.4")), "env.cuda_module_loading")
    assert f.status == "warn" and "export CUDA_MODULE_LOADING=LAZY" in f.remedy and "12.2" in f.evidence.source
    assert f.remedy.startswith("unset CUDA_MODULE_LOADING")


def test_lazy_passes():
    assert one(run(Audit(environment={"CUDA_MODULE_LOADING": "LAZY"}), gpu_machine("11.8")), "env.cuda_module_loading").status == "pass"


def test_unset_on_a_real_cuda_12_2_driver_is_lazy_by_default():
    machine = capture.merge(capture.read_captures(str(RTX4090_X8_CUDA_12_2)))
    assert machine.driver.cuda_version == "12.2"
    f = one(run(Audit(), machine), "env.cuda_module_loading")
    assert f.status == "pass" and "LAZY is the default since CUDA 12.2" in f.summary


def test_unset_on_an_older_driver_with_pytorch_passes_because_pytorch_sets_it():
    machine = gpu_machine("12.0", Torch(installed=True, version="2.1.2+cu118", cuda="11.8"))
    f = one(run(Audit(), machine), "env.cuda_module_loading")
    assert f.status == "pass" and "PyTorch 2.1.2+cu118 sets LAZY itself" in f.summary


def test_unset_on_an_older_driver_without_pytorch_warns():
    f = one(run(Audit(), gpu_machine("11.8")), "env.cuda_module_loading")
    assert f.status == "warn" and "CUDA 11.8 driver" in f.summary and f.remedy.startswith("export CUDA_MODULE_LOADING=LAZY")


def test_a_runtime_older_than_11_7_cannot_load_lazily():
    machine = gpu_machine("11.4", Torch(installed=True, version="1.12.1+cu113", cuda="11.3"))
    f = one(run(Audit(), machine), "env.cuda_module_loading")
    assert f.status == "pass" and "needs a CUDA 11.7+ runtime" in f.summary


def test_cuda_module_loading_without_gpu_skips():
    assert one(run(Audit(environment={"CUDA_MODULE_LOADING": "EAGER"})), "env.cuda_module_loading").status == "skip"
