"""env.*: the environment audit (D5): who could get in, what drops or throttles your sessions,
and the line that fixes each. Advice only: gpuvet changes nothing.

Security follows the seed's story of GPU time stolen through an SSH tunnel: servers listening on
every interface without a login, SSH password or root logins, authorized_keys entries that allow
tunnels. Comfort follows the seed's tuning advice: SSH keep-alive, Jupyter's output rate limit
and notebook directory, CUDA_MODULE_LOADING.
"""

from __future__ import annotations

import ipaddress

from ..catalog import checked
from ..facts import Audit, Listener
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
ENV_AUTHORIZED_KEYS = checked("env.authorized_keys")
ENV_CUDA_MODULE_LOADING = checked("env.cuda_module_loading")
ENV_EXPOSED_SERVERS = checked("env.exposed_servers")
ENV_JUPYTER = checked("env.jupyter")
ENV_SSH_KEEPALIVE = checked("env.ssh_keepalive")
ENV_SSH_LOGIN = checked("env.ssh_login")

SECURITY_SOURCE = ("GPU time is stolen through open notebook servers and SSH reverse tunnels; sshd_config(5) "
                 "(PermitRootLogin, PasswordAuthentication, AllowTcpForwarding), authorized_keys options in sshd(8), "
                 "Jupyter Server's security docs (token or password)")
_KEYS_EXPECTED = "keys restricted with no-port-forwarding,no-X11-forwarding, or sshd forbidding TCP forwarding"
# Each finding cites its own part of the seed's tuning advice.
TUNING_SOURCE = "sshd_config(5) ClientAliveInterval/ClientAliveCountMax"
JUPYTER_RATE_SOURCE = "Jupyter Server's ServerApp.iopub_data_rate_limit (classic Notebook < 7: NotebookApp.*)"


def check_environment(ctx: Context) -> list[Finding]:
    audit = ctx.machine.audit
    if audit is None:
        return []
    return (check_exposed_servers(audit) + check_ssh_login(audit) + check_authorized_keys(audit)
            + check_ssh_keepalive(audit) + check_jupyter(audit) + check_cuda_module_loading(ctx, audit))


# -- env.exposed_servers ----------------------------------------------------------------------

# What someone who reaches an unprotected server of this kind can do, and the lines that close it.
_EXPOSURE = {
    "jupyter": ("runs any code, with this machine's GPUs and files, as the server's user",
                "in ~/.jupyter/jupyter_server_config.py: c.ServerApp.ip = '127.0.0.1' and "
                "c.ServerApp.token = '<a long random string>' (or run `jupyter server password`; classic Notebook < 7: "
                "c.NotebookApp.ip / c.NotebookApp.token), restart it, and open it through a tunnel: "
                "`ssh -N -L {port}:127.0.0.1:{port} user@this-machine`, then http://127.0.0.1:{port} on your computer"),
    "ray-dashboard": ("submits jobs, that is runs any code, on this machine",
                      "start Ray with `--dashboard-host=127.0.0.1` (its default) and reach it with "
                      "`ssh -N -L {port}:127.0.0.1:{port} user@this-machine`"),
    "code-server": ("gets a terminal on this machine",
                    "in ~/.config/code-server/config.yaml: `bind-addr: 127.0.0.1:{port}` and `auth: password`; "
                    "reach it with `ssh -N -L {port}:127.0.0.1:{port} user@this-machine`"),
    "file-server": ("downloads every file it serves (in a home directory: SSH keys, cloud credentials, datasets)",
                    "stop it, or serve on loopback only: `python3 -m http.server {port} --bind 127.0.0.1`, and reach it "
                    "with `ssh -N -L {port}:127.0.0.1:{port} user@this-machine`"),
    "tensorboard": ("reads your training logs, metrics and model graphs",
                    "start TensorBoard without `--bind_all` / `--host 0.0.0.0` (it binds localhost by default) and use "
                    "`ssh -N -L {port}:127.0.0.1:{port} user@this-machine`"),
}
_RUNS_CODE = {"jupyter", "ray-dashboard", "code-server"}


def check_exposed_servers(audit: Audit) -> list[Finding]:
    if not audit.listeners and "listeners" in audit.unavailable:
        return [finding(ENV_EXPOSED_SERVERS, "host", SKIP, f"listening sockets not readable: {audit.unavailable['listeners']}",
                        remedy="`sudo ss -ltnp` lists them")]
    exposed = [item for item in audit.listeners if reachable_from_network(item)]
    findings = []
    for item in _one_per_server(exposed):
        if item.protected is True or item.kind == "test-server":
            continue  # sshd; Jupyter or code-server with a token or password; a daemon with its own credentials;
            # a bandwidth test server (it runs no code and serves no files)
        exposure = _EXPOSURE.get(item.kind) if item.kind is not None else None
        if exposure is not None:
            findings.append(_exposed(item, exposure))
        elif item.all_interfaces:
            findings.append(_open_unknown(item))
    if findings:
        return findings
    listing = ", ".join(_describe(item) for item in exposed) or "none"
    return [finding(ENV_EXPOSED_SERVERS, "host", PASS,
                    f"no server without a login listens on the network ({len(exposed)} listening beyond loopback)",
                    measured=f"listening beyond loopback: {listing}", expected=EXPOSED_EXPECTED, source=SECURITY_SOURCE)]


EXPOSED_EXPECTED = ("every server on all interfaces has a login (sshd; Jupyter or code-server with a token or password); "
                    "anything else bound to 127.0.0.1 and reached through `ssh -L`")


def _one_per_server(listeners: list[Listener]) -> list[Listener]:
    """A server on 0.0.0.0 and :: at once is one server: the first socket of each (process, port)."""
    seen: dict[tuple, Listener] = {}
    for item in listeners:
        seen.setdefault((item.pid, item.port, item.kind), item)
    return list(seen.values())


def _open_unknown(listener: Listener) -> Finding:
    """A server gpuvet does not know on every interface: it may need no login at all."""
    where = _describe(listener)
    port = listener.port
    container = (listener.process or "") in ("docker-proxy", "rootlesskit", "conmon")
    what = "a container's published port" if container else "a server gpuvet does not know"
    named = "" if listener.process else " (process not readable: `sudo ss -ltnp` names it)"
    bind = (f"publish the container's port on loopback only: `docker run -p 127.0.0.1:{port}:{port} ...`" if container else
            "if it is not meant for the network, restart it bound to 127.0.0.1 (its --bind / --host / --listen option)")
    return finding(
        ENV_EXPOSED_SERVERS, "host", WARN,
        f"{where} listens on every interface{named}: {what}, with no login gpuvet can see; anyone who can reach port {port} "
        "can use whatever it serves",
        measured=f"{where}: {listener.note or 'kind unknown'}", expected=EXPOSED_EXPECTED, source=SECURITY_SOURCE,
        remedy=(f"{bind} and reach it with `ssh -N -L {port}:127.0.0.1:{port} user@this-machine`; or let only your "
                f"address in: `sudo ufw allow from YOUR_IP to any port {port} proto tcp && sudo ufw deny {port}/tcp` "
                "(or the cloud security group); if it has a login of its own, this warning is advice only"))


def reachable_from_network(listener: Listener) -> bool:
    """Bound to every interface or to a non-loopback address."""
    if listener.all_interfaces:
        return True
    try:
        return not ipaddress.ip_address(listener.address.split("%")[0]).is_loopback
    except ValueError:
        return listener.address != "localhost"


def _exposed(listener: Listener, exposure: tuple[str, str]) -> Finding:
    who_can, closing = exposure
    where = _describe(listener)
    reach = ("anyone who can reach this machine's port "
             f"{listener.port} (a cloud security group or the container's port mapping may still block it; gpuvet cannot see those)")
    if listener.protected is False:
        status = FAIL if listener.kind in _RUNS_CODE else WARN
        summary = f"{where} has no login: {reach} {who_can}"
        if listener.kind == "file-server" and listener.note:
            summary += f"; it {listener.note}"
        expected = "bound to 127.0.0.1, or protected by a token or password"
    else:
        status = WARN
        summary = f"{where} listens on the network and gpuvet cannot tell whether it has a token or password"
        expected = "a token or password known to be set, or bound to 127.0.0.1"
    return finding(ENV_EXPOSED_SERVERS, "host", status, summary,
                   measured=f"{where}: {listener.note or 'no details'}", expected=expected,
                   source=SECURITY_SOURCE + ("; Jupyter docs: a server without token or password runs code for anyone who "
                                           "connects" if listener.kind == "jupyter" else ""),
                   remedy=closing.format(port=listener.port))


def _describe(listener: Listener) -> str:
    what = listener.kind or listener.process or "a server"
    named = listener.process if listener.kind and listener.process else None  # the process, when the kind is the name
    process = f" ({named}, pid {listener.pid})" if named and listener.pid else (
        f" (pid {listener.pid})" if listener.pid else "")
    return f"{what}{process} on {listener.address or '*'}:{listener.port}"


# -- env.ssh_login ------------------------------------------------------------------------------

# sshd's built-in values (sshd_config(5)) for options a file leaves unset.
SSHD_DEFAULTS = {"PermitRootLogin": "prohibit-password", "PasswordAuthentication": "yes",
                 "KbdInteractiveAuthentication": "yes", "PermitEmptyPasswords": "no", "GatewayPorts": "no",
                 "AllowTcpForwarding": "yes", "ClientAliveInterval": "0"}
SSHD_HARDENED = ("PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                 "PermitEmptyPasswords no")


def sshd_value(audit: Audit, option: str) -> tuple[str, str]:
    """(effective value in lower case, where it comes from)."""
    if option in audit.sshd:
        return audit.sshd[option].lower(), audit.sshd.get(f"{option}.at", "sshd_config")
    return SSHD_DEFAULTS.get(option, "").lower(), "not set: sshd's default"


def _has_sshd(audit: Audit) -> bool:
    return bool(audit.sshd) or "sshd" not in audit.unavailable


def _ssh_listening(audit: Audit) -> bool | None:
    """True/False when the listeners were read; None when they could not be."""
    if "listeners" in audit.unavailable:
        return None
    return any(item.kind == "ssh" for item in audit.listeners)


def check_ssh_login(audit: Audit) -> list[Finding]:
    if not _has_sshd(audit):
        return [finding(ENV_SSH_LOGIN, "host", SKIP, f"no SSH server configuration: {audit.unavailable.get('sshd')}")]
    values = {opt: sshd_value(audit, opt) for opt in ("PermitRootLogin", "PasswordAuthentication",
                                                     "KbdInteractiveAuthentication", "PermitEmptyPasswords", "GatewayPorts")}
    passwords = values["PasswordAuthentication"][0] == "yes" or values["KbdInteractiveAuthentication"][0] == "yes"
    problems, status = [], WARN
    if values["PermitEmptyPasswords"][0] == "yes" and passwords:
        problems.append("accounts without a password can log in (PermitEmptyPasswords yes)")
        status = FAIL
    if values["PermitRootLogin"][0] == "yes":
        problems.append("root can log in with a password" if passwords else
                        "root can log in (PermitRootLogin yes): key-only today, with a password the day password logins "
                        "are turned on; `PermitRootLogin prohibit-password` (or `no`) closes it")
    if passwords:
        which = [opt for opt in ("PasswordAuthentication", "KbdInteractiveAuthentication") if values[opt][0] == "yes"]
        problems.append(f"password logins are allowed ({', '.join(which)}): a guessed or leaked password is enough")
    if values["GatewayPorts"][0] in ("yes", "clientspecified"):
        problems.append("GatewayPorts lets a tunnel (ssh -R) open ports to the whole network")
    measured = "; ".join(f"{opt} {value} ({where})" for opt, (value, where) in values.items())
    listening = _ssh_listening(audit)
    state = {True: "sshd is listening", False: "sshd is not listening now", None: "sshd listening state unknown"}[listening]
    if not problems:
        return [finding(ENV_SSH_LOGIN, "host", PASS, f"SSH logins need a key ({state})", measured=measured,
                        expected="PermitRootLogin no/prohibit-password, PasswordAuthentication no", source=SECURITY_SOURCE)]
    if listening is False:  # an installed but stopped sshd: the risk starts the moment it does
        status = WARN
    suffix = "" if listening is not False else " (applies when sshd starts)"
    return [finding(ENV_SSH_LOGIN, "host", status, "; ".join(problems) + suffix, measured=f"{measured}; {state}",
                    expected="; ".join(SSHD_HARDENED) + "; GatewayPorts no",
                    source=SECURITY_SOURCE + "; sshd_config(5): the first value obtained for an option is used",
                    remedy=("make sure your key logs in, then put these lines in /etc/ssh/sshd_config.d/00-gpuvet.conf "
                            "(read first on Debian/Ubuntu, whose sshd_config Includes sshd_config.d/*.conf at the top; "
                            "elsewhere at the top of /etc/ssh/sshd_config): " + " / ".join(SSHD_HARDENED) +
                            " / GatewayPorts no; then `sudo sshd -t && sudo systemctl reload ssh` "
                            "and check with `sudo sshd -T | grep -Ei 'password|rootlogin|gatewayports'`"))]


# -- env.authorized_keys ------------------------------------------------------------------------

KEY_OPTIONS = "no-port-forwarding,no-X11-forwarding,no-agent-forwarding"


def check_authorized_keys(audit: Audit) -> list[Finding]:
    reason = audit.unavailable.get("authorized_keys", "")
    if not audit.authorized_keys and reason and not reason.startswith("no "):
        return [finding(ENV_AUTHORIZED_KEYS, "host", SKIP, f"authorized_keys not readable: {reason}")]
    if not audit.authorized_keys:
        return [finding(ENV_AUTHORIZED_KEYS, "host", PASS, "no authorized_keys entries for this user",
                        measured=reason or "the file has no keys", expected=_KEYS_EXPECTED, source=SECURITY_SOURCE)]
    loose = [key for key in audit.authorized_keys if key.get("restricted") != "yes"]
    listing = "; ".join(_key_words(key) for key in loose)
    measured = f"{len(audit.authorized_keys)} key(s), {len(loose)} without no-port-forwarding and no-X11-forwarding: {listing}"
    if not loose:
        return [finding(ENV_AUTHORIZED_KEYS, "host", PASS,
                        f"all {len(audit.authorized_keys)} authorized key(s) are restricted (no forwarding)",
                        measured=f"{len(audit.authorized_keys)} key(s), all restricted", expected=_KEYS_EXPECTED,
                        source=SECURITY_SOURCE)]
    forwarding, where = sshd_value(audit, "AllowTcpForwarding")
    if forwarding in ("no", "local"):
        return [finding(ENV_AUTHORIZED_KEYS, "host", PASS,
                        f"{len(loose)} key(s) without forwarding restrictions, but sshd forbids reverse tunnels "
                        f"(AllowTcpForwarding {forwarding}, {where})", measured=measured, expected=_KEYS_EXPECTED,
                        source=SECURITY_SOURCE)]
    return [finding(
        ENV_AUTHORIZED_KEYS, "host", WARN,
        f"{len(loose)} of {len(audit.authorized_keys)} authorized key(s) may open tunnels (ssh -R / -L) into and out of "
        f"this machine: whoever holds such a key can expose its services or use its GPUs through a tunnel",
        measured=measured, expected=f"each line starting with {KEY_OPTIONS} (or `restrict,pty`)",
        source=SECURITY_SOURCE + " (the seed: add no-port-forwarding,no-X11-forwarding to authorized_keys)",
        remedy=(f"in ~/.ssh/authorized_keys, start each key line with the options: `{KEY_OPTIONS} ssh-ed25519 AAAA... you@laptop`; "
                "a key you use for Jupyter tunnels can keep `ssh -L` to one port with "
                "`permitopen=\"127.0.0.1:8888\",no-X11-forwarding,no-agent-forwarding`; or server-wide, "
                "`AllowTcpForwarding local` in sshd_config forbids reverse tunnels (ssh -R) and keeps ssh -L"))]


def _key_words(key: dict[str, str]) -> str:
    comment = key.get("comment") or "no comment"
    return f"line {key.get('line', '?')}: {key.get('type')} {comment} {key.get('fingerprint', '')}".strip()


# -- env.ssh_keepalive --------------------------------------------------------------------------

# The seed's lines. (It also suggests `UseRoaming no`, which OpenSSH removed in 7.2: not advised.)
CLIENT_KEEPALIVE = ("Host *", "    ServerAliveInterval 30", "    ServerAliveCountMax 3", "    TCPKeepAlive yes")


def check_ssh_keepalive(audit: Audit) -> list[Finding]:
    client = _positive(audit.ssh_client.get("ServerAliveInterval"))
    server_interval, server_where = sshd_value(audit, "ClientAliveInterval")
    server = _has_sshd(audit) and _positive(server_interval)
    measured = (f"~/.ssh/config ServerAliveInterval {audit.ssh_client.get('ServerAliveInterval', 'not set')}; "
                f"sshd ClientAliveInterval {server_interval or '?'} ({server_where})")
    remedy = ("on the computer you connect from, add to ~/.ssh/config: " + " / ".join(line.strip() for line in CLIENT_KEEPALIVE)
              + "; or on this machine (root) add `ClientAliveInterval 30` and `ClientAliveCountMax 3` to /etc/ssh/sshd_config")
    expected = "ClientAliveInterval > 0 in this machine's sshd (or ServerAliveInterval 30 on the computer you connect from)"
    if server:
        return [finding(ENV_SSH_KEEPALIVE, "host", PASS, "SSH keep-alive is on: this machine's sshd probes idle sessions",
                        measured=measured, expected=expected, source=TUNING_SOURCE + ": TCPKeepAlive yes, ServerAliveInterval 30")]
    listening = _ssh_listening(audit)
    if listening is False or (not _has_sshd(audit) and listening is None):
        return [finding(ENV_SSH_KEEPALIVE, "host", SKIP,
                        "no SSH server running here; if you reach this machine with ssh, keep idle sessions alive from your side",
                        measured=measured, source=TUNING_SOURCE, remedy=remedy)]
    # ~/.ssh/config here sets what ssh *from* this machine sends: it keeps no session *to* it alive.
    own_client = ("; this machine's own ~/.ssh/config sets ServerAliveInterval, which only keeps ssh sessions from it "
                  "to other machines alive") if client else ""
    return [finding(ENV_SSH_KEEPALIVE, "host", WARN,
                    "no SSH keep-alive on the server side: idle sessions to this machine (a long training run in the "
                    "foreground, an rsync, a tunnel to Jupyter) are dropped by NAT and cloud firewalls after minutes of "
                    f"silence unless the computer you connect from sends keep-alives{own_client}",
                    measured=measured, expected=expected,
                    source=TUNING_SOURCE + ": TCPKeepAlive yes, ServerAliveInterval 30", remedy=remedy)]


def _positive(value: str | None) -> bool:
    try:
        return value is not None and int(value.split()[0]) > 0
    except (ValueError, IndexError):
        return False


# -- env.jupyter ------------------------------------------------------------------------------

IOPUB_MIN = 1e7  # bytes/s: the seed's value; Jupyter's default of 1e6 cuts off large outputs
IOPUB_DEFAULT = 1e6  # NotebookApp, ServerApp and ZMQChannelsWebsocketConnection alike


def check_jupyter(audit: Audit) -> list[Finding]:
    settings = audit.jupyter
    running = settings.get("running") == "yes"
    if not running and not settings.get("config_files") and not settings.get("resource_monitors"):
        return [finding(ENV_JUPYTER, "host", SKIP, "no Jupyter server running and no Jupyter configuration here",
                        remedy=f"if you start Jupyter here: c.ServerApp.iopub_data_rate_limit = {IOPUB_MIN:.0f} and a "
                               "root_dir on local disk")]
    where = settings.get("server") or f"config {settings.get('config_files') or settings.get('resource_monitors')}"
    findings = [_iopub(settings, where)]
    findings += [f for f in (_network_root(settings), _ephemeral_root(settings), _resource_monitors(settings),
                             _autosave_on_network(settings)) if f is not None]
    return findings


JUPYTER_TUNING_SOURCE = ("renters' JupyterLab tuning: resource-monitor extensions poll the GPU and autosave writes "
                         "to network storage; JupyterLab's settings (Settings > Autosave Documents)")


def _resource_monitors(settings: dict[str, str]) -> Finding | None:
    """jupyter-resource-usage (nbresuse) polls ps and nvidia-smi every few seconds: CPU taken from
    the training process (seed 2: every 5 s, a performance killer)."""
    monitors = settings.get("resource_monitors")
    if not monitors:
        return None
    names = [part.split(" (", 1)[0] for part in monitors.split(", ")]
    return finding(ENV_JUPYTER, "host", WARN,
                   f"Jupyter resource-monitor extension enabled: {monitors}: it polls processes and nvidia-smi every "
                   "few seconds, taking CPU from your training and delaying its scheduling",
                   measured=f"enabled: {monitors}", expected="no resource-monitor server extension",
                   source=JUPYTER_TUNING_SOURCE,
                   remedy="; ".join(f"`jupyter server extension disable {name}`" for name in names)
                          + " (classic Notebook: c.NotebookApp.nbserver_extensions = {}); restart Jupyter")


def _autosave_on_network(settings: dict[str, str]) -> Finding | None:
    """Autosave writes every open notebook every 2 minutes: on network storage with few IOPS that
    competes with the job's own reads (seed 2: switch it off on cloud storage)."""
    autosave = settings.get("autosave") or ""
    if not autosave.startswith("on") or settings.get("root_dir.kind") != "network":
        return None
    return finding(ENV_JUPYTER, "host", WARN,
                   f"Jupyter autosave is {autosave} onto the network file system of its notebook directory "
                   f"({settings.get('root_dir')}): the writes compete with your data loading for the storage's IOPS",
                   measured=f"autosave {autosave}; root_dir {settings.get('root_dir')} on {settings.get('root_dir.fs_type')}",
                   expected="autosave off on network storage", source=JUPYTER_TUNING_SOURCE,
                   remedy="c.NotebookApp.autosave_interval = 0 (classic Notebook), or JupyterLab Settings > Document "
                          "Manager > autosave off; save by hand")


def _iopub(settings: dict[str, str], where: str) -> Finding:
    if settings.get("limit_rate", "").lower() == "false":
        return finding(ENV_JUPYTER, "host", PASS, "Jupyter's output rate limit is off (limit_rate False)",
                       measured=f"limit_rate False ({settings.get('limit_rate.at')}); {where}",
                       expected=f"no limit, or >= {IOPUB_MIN:.0e} bytes/s", source=JUPYTER_RATE_SOURCE)
    raw = settings.get("iopub_data_rate_limit")
    try:
        limit = float(raw) if raw is not None else IOPUB_DEFAULT
    except ValueError:
        return finding(ENV_JUPYTER, "host", SKIP, f"iopub_data_rate_limit is {raw}: not a number gpuvet can read")
    measured = (f"iopub_data_rate_limit {limit:.3g} bytes/s ({settings.get('iopub_data_rate_limit.at', 'not set: Jupyter default')}); "
                f"{where}")
    if settings.get("notebook_app_ignored"):  # the seed's NotebookApp line, which this server does not read
        measured += f"; {settings['notebook_app_ignored']} ({settings.get('server_packages')})"
    if limit > 0 and limit < IOPUB_MIN:
        return finding(ENV_JUPYTER, "host", WARN,
                       f"Jupyter limits cell output to {limit:.3g} bytes/s: large outputs (big plots, printed tensors, "
                       "progress bars) stop with 'IOPub data rate exceeded'",
                       measured=measured, expected=f">= {IOPUB_MIN:.0e} bytes/s", source=JUPYTER_RATE_SOURCE,
                       remedy=f"in ~/.jupyter/jupyter_server_config.py: c.ServerApp.iopub_data_rate_limit = {IOPUB_MIN:.0f} "
                              f"(classic Notebook < 7: c.NotebookApp.iopub_data_rate_limit), or start it with "
                              f"--ServerApp.iopub_data_rate_limit={IOPUB_MIN:.0f}; restart Jupyter")
    return finding(ENV_JUPYTER, "host", PASS, f"Jupyter's output rate limit is {limit:.3g} bytes/s", measured=measured,
                   expected=f"no limit, or >= {IOPUB_MIN:.0e} bytes/s", source=JUPYTER_RATE_SOURCE)


def _network_root(settings: dict[str, str]) -> Finding | None:
    if settings.get("root_dir.kind") != "network":
        return None
    root = settings.get("root_dir")
    return finding(
        ENV_JUPYTER, "host", WARN,
        f"Jupyter's notebook directory {root} is on a network file system ({settings.get('root_dir.fs_type')}): "
        "every file a notebook opens is a network round trip (the seed: loading a model from a notebook took 4.3 s "
        "against 1.8 s)",
        measured=f"root_dir {root} ({settings.get('root_dir.at')}) on {settings.get('root_dir.fs_type')}",
        expected="notebooks and the data they read on local disk", source=JUPYTER_TUNING_SOURCE,
        remedy="c.ServerApp.root_dir = '/home/<you>/notebooks' (a local disk) in ~/.jupyter/jupyter_server_config.py; "
               "copy hot data to local NVMe, or pack many small files into tar / WebDataset shards")


def _ephemeral_root(settings: dict[str, str]) -> Finding | None:
    reason = settings.get("root_dir.ephemeral")
    if not reason:
        return None
    root = settings.get("root_dir")
    return finding(
        ENV_JUPYTER, "host", WARN,
        f"Jupyter's notebook directory {root} does not survive: {reason}; notebooks and the checkpoints saved next to "
        "them are lost with it",
        measured=f"root_dir {root} ({settings.get('root_dir.at')}) on {settings.get('root_dir.fs_type')}: {reason}",
        expected="notebooks on a persistent volume", source="cloud providers' docs on instance (local, "
                                                            "ephemeral) storage: its data is lost when the instance is "
                                                            "stopped or reclaimed",
        remedy="keep notebooks on a mounted volume or persistent disk (e.g. `docker run -v /data/notebooks:/workspace ...` "
               "and c.ServerApp.root_dir = '/workspace'), and sync checkpoints to shared or object storage")


# -- env.cuda_module_loading -------------------------------------------------------------------

LAZY_DEFAULT_SINCE = (12, 2)  # CUDA drivers from 12.2 load modules lazily by default on Linux
LAZY_AVAILABLE_SINCE = (11, 7)  # the runtime a program is built with must be 11.7 or newer
TORCH_SETS_LAZY_SINCE = (1, 13)  # PyTorch sets CUDA_MODULE_LOADING=LAZY itself when it is unset
_LAZY_EXPECTED = "lazy CUDA module loading in effect (set, the default of the runtime, or set by PyTorch)"
LAZY_SOURCE = ("NVIDIA CUDA Programming Guide, Lazy Loading: introduced in 11.7, default on Linux since 12.2; "
               "PyTorch >= 1.13 sets LAZY when unset (its CUDA initialisation code)")


def check_cuda_module_loading(ctx: Context, audit: Audit) -> list[Finding]:
    stack = ctx.machine.stack
    value = audit.environment.get("CUDA_MODULE_LOADING") or (stack.cuda_module_loading if stack else None)
    torch = stack.torch if stack else None
    if not ctx.machine.gpus and not (torch and torch.cuda):
        return [finding(ENV_CUDA_MODULE_LOADING, "host", SKIP, "no GPU here: CUDA module loading does not matter")]
    driver_cuda = _version(ctx.machine.driver.cuda_version)
    measured = (f"CUDA_MODULE_LOADING={value or '(unset)'}; driver CUDA {ctx.machine.driver.cuda_version or '?'}; "
                f"torch {torch.version if torch and torch.version else '-'} (CUDA {torch.cuda if torch and torch.cuda else '-'})")
    remedy = "export CUDA_MODULE_LOADING=LAZY (in ~/.bashrc or the job script)"
    if value and value.upper() == "EAGER":
        return [finding(ENV_CUDA_MODULE_LOADING, "host", WARN,
                        "CUDA_MODULE_LOADING=EAGER: every kernel of every CUDA library loads when a process starts "
                        "(seconds more start-up, hundreds of MB more GPU memory per process)",
                        measured=measured, expected="LAZY (or unset on CUDA >= 12.2)", source=LAZY_SOURCE,
                        remedy="unset CUDA_MODULE_LOADING where it is set to EAGER (shell profile, job script, container "
                               "image), or " + remedy)]
    if value and value.upper() in ("LAZY", "DEFAULT"):
        return [finding(ENV_CUDA_MODULE_LOADING, "host", PASS, f"CUDA_MODULE_LOADING={value}", measured=measured,
                        expected=_LAZY_EXPECTED, source=LAZY_SOURCE)]
    if driver_cuda and driver_cuda >= LAZY_DEFAULT_SINCE:
        return [finding(ENV_CUDA_MODULE_LOADING, "host", PASS,
                        "CUDA_MODULE_LOADING unset: LAZY is the default since CUDA 12.2, and this driver supports "
                        f"CUDA {ctx.machine.driver.cuda_version}", measured=measured, expected=_LAZY_EXPECTED, source=LAZY_SOURCE)]
    runtime = _version(torch.cuda if torch else None)
    if torch is not None and runtime and runtime < LAZY_AVAILABLE_SINCE:
        return [finding(ENV_CUDA_MODULE_LOADING, "host", PASS,
                        f"lazy loading needs a CUDA 11.7+ runtime; this PyTorch uses CUDA {torch.cuda}", measured=measured,
                        expected=_LAZY_EXPECTED, source=LAZY_SOURCE)]
    torch_version = _version(torch.version if torch else None)
    if torch is not None and torch_version and torch_version >= TORCH_SETS_LAZY_SINCE and runtime:
        return [finding(ENV_CUDA_MODULE_LOADING, "host", PASS,
                        f"CUDA_MODULE_LOADING unset: PyTorch {torch.version} sets LAZY itself; other CUDA programs load eagerly "
                        "on this driver", measured=measured, expected=_LAZY_EXPECTED, source=LAZY_SOURCE, remedy=remedy)]
    if driver_cuda is None:
        return [finding(ENV_CUDA_MODULE_LOADING, "host", SKIP,
                        "driver CUDA version unknown: cannot tell whether modules load lazily by default",
                        measured=measured, source=LAZY_SOURCE, remedy=remedy)]
    return [finding(ENV_CUDA_MODULE_LOADING, "host", WARN,
                    f"CUDA_MODULE_LOADING unset on a CUDA {ctx.machine.driver.cuda_version} driver: CUDA programs load every "
                    "kernel at start (slower start, more GPU memory per process)",
                    measured=measured, expected="LAZY", source=LAZY_SOURCE, remedy=remedy)]


def _version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of "12.4", "2.3.1+cu121"; None when unreadable."""
    if not text:
        return None
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None
