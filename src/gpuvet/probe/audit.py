"""The environment audit (A9, D5): configuration that slows, breaks or exposes work here.

Read-only: files are read, processes are looked at, nothing is changed and nothing is run.
`collect_audit` never raises; a part it cannot read is left empty with the reason in
`audit.unavailable`. The parsers are pure functions over strings (file access is passed in as a
`read(path) -> text | None` function), so they are tested on documented inputs.

What lands in the `Audit` (facts.py), all as strings:
- ssh_client / sshd: an option's effective value under its canonical name, and where it was set
  under "<Option>.at" ("/etc/ssh/sshd_config.d/50-cloud-init.conf:1").
- authorized_keys: one dict per key: type, comment, options, restricted ("yes"/"no"),
  fingerprint (SHA256, as `ssh-keygen -l` prints it), line.
- jupyter: options from the config files as "<Class>.<option>" (+ ".at"), and the effective
  settings of this machine's Jupyter: "running", "iopub_data_rate_limit", "limit_rate",
  "root_dir" (+ ".at", ".fs_type", ".kind", ".ephemeral"). Tokens and passwords are never stored: "(set)",
  "(empty)" or "(expression)" stand for them.
- environment: the variables worth reporting that are set (secrets only as "(set)").
"""

from __future__ import annotations

import ast
import base64
import contextlib
import glob as globlib
import hashlib
import ipaddress
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..facts import Audit, Listener

Read = Callable[[str], "str | None"]  # file text, or None when the file does not exist
Glob = Callable[[str], list[str]]

SET, EMPTY, EXPRESSION = "(set)", "(empty)", "(expression)"


# -- ssh_config / sshd_config -----------------------------------------------------------------

SSH_CLIENT_OPTIONS = ("ServerAliveInterval", "ServerAliveCountMax", "TCPKeepAlive")
SSHD_OPTIONS = ("PermitRootLogin", "PasswordAuthentication", "KbdInteractiveAuthentication", "PermitEmptyPasswords",
                "PubkeyAuthentication", "AllowTcpForwarding", "GatewayPorts", "ClientAliveInterval",
                "ClientAliveCountMax", "TCPKeepAlive", "Port", "UsePAM")
# Deprecated names sshd still reads as the same option.
SSHD_ALIASES = {"challengeresponseauthentication": "KbdInteractiveAuthentication"}
INCLUDE_DEPTH = 16  # sshd's own limit on nested Include


@dataclass
class ConfigLine:
    key: str  # lower case: OpenSSH keywords are case-insensitive
    value: str
    where: str  # "path:line"
    applies: bool = True  # False inside a Host/Match block that does not cover every connection


def config_lines(text: str, path: str) -> list[ConfigLine]:
    """`Keyword value`, `Keyword=value` lines of an OpenSSH config; comments and blanks dropped."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"(\S+?)\s*(?:=\s*|\s+)(.*)$", line)
        if not match:
            continue
        value = re.split(r"\s+#", match.group(2), maxsplit=1)[0].strip()  # trailing comments: OpenSSH 8.7+
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        lines.append(ConfigLine(match.group(1).lower(), value, f"{path}:{number}"))
    return lines


def _expand(path: str, read: Read, glob: Glob, base_dir: str, block_applies: Callable[[str, str], bool | None],
            applies: bool = True, depth: int = 0) -> list[ConfigLine]:
    """The lines of `path` with Include'd files spliced in where they are named.

    `block_applies(key, value)` says whether a block keyword (Host, Match) starts a block that
    covers every connection (True), only some (False), or is not a block keyword (None). A block
    opened in an included file ends with that file.
    """
    text = read(path)
    if text is None or depth > INCLUDE_DEPTH:
        return []
    out = []
    for line in config_lines(text, path):
        starts = block_applies(line.key, line.value)
        if starts is not None:
            applies = starts
            continue
        if line.key == "include":
            for pattern in shlex.split(line.value):
                full = pattern if os.path.isabs(pattern) or pattern.startswith("~") else os.path.join(base_dir, pattern)
                for included in sorted(glob(full)):
                    out += _expand(included, read, glob, base_dir, block_applies, applies, depth + 1)
            continue
        line.applies = applies
        out.append(line)
    return out


def _first_values(lines: Iterable[ConfigLine], wanted: Iterable[str], aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """First value wins, as in ssh and sshd: {Option: value, "Option.at": where}."""
    canonical = {name.lower(): name for name in wanted} | {k: v for k, v in (aliases or {}).items()}
    found: dict[str, str] = {}
    for line in lines:
        name = canonical.get(line.key)
        if name and line.applies and name not in found:
            found[name] = line.value
            found[f"{name}.at"] = line.where
    return found


def _sshd_block(key: str, value: str) -> bool | None:
    if key != "match":
        return None
    return value.strip().lower() == "all"


def _ssh_client_block(key: str, value: str) -> bool | None:
    if key == "host":
        return "*" in value.split()
    if key == "match":
        return value.strip().lower() == "all"
    return None


def parse_sshd_config(path: str, read: Read, glob: Glob, base_dir: str = "/etc/ssh") -> dict[str, str]:
    """Effective sshd options outside Match blocks (sshd: the first value obtained is used;
    relative Include paths are under /etc/ssh)."""
    return _first_values(_expand(path, read, glob, base_dir, _sshd_block), SSHD_OPTIONS, SSHD_ALIASES)


def parse_ssh_client_config(paths: list[str], read: Read, glob: Glob, base_dir: str) -> dict[str, str]:
    """Options that apply to every host: lines before the first Host, in `Host *` (or a
    pattern list containing *) and `Match all`. The user's file comes before /etc/ssh/ssh_config."""
    lines = [line for path in paths for line in _expand(path, read, glob, base_dir, _ssh_client_block)]
    return _first_values(lines, SSH_CLIENT_OPTIONS)


# -- authorized_keys ----------------------------------------------------------------------------

_KEY_TYPE = re.compile(r"(ssh-(rsa|dss|ed25519|ed448)|ecdsa-sha2-nistp\d+|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
                       r"(-cert-v01@openssh\.com)?$")


def parse_authorized_keys(text: str) -> list[dict[str, str]]:
    """One dict per key line: type, comment, options, restricted, fingerprint, line."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        options, rest = _split_options(line)
        fields = rest.split(None, 2)
        if len(fields) < 2 or not _KEY_TYPE.match(fields[0]):
            continue
        entries.append({
            "line": str(number),
            "type": fields[0],
            "comment": fields[2] if len(fields) > 2 else "",
            "options": options,
            "restricted": "yes" if is_restricted(options) else "no",
            "fingerprint": _fingerprint(fields[1]),
        })
    return entries


def _split_options(line: str) -> tuple[str, str]:
    """(options, the rest): options come first, up to the first space outside double quotes."""
    first = line.split(None, 1)[0]
    if _KEY_TYPE.match(first):
        return "", line
    quoted = False
    for i, char in enumerate(line):
        if char == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        elif char.isspace() and not quoted:
            return line[:i], line[i:].strip()
    return line, ""


def option_names(options: str) -> set[str]:
    """Lower-case option names of an authorized_keys options field (values dropped)."""
    names, quoted, current = set(), False, ""
    for i, char in enumerate(options + ","):
        if char == '"' and (i == 0 or options[i - 1] != "\\"):
            quoted = not quoted
        if char == "," and not quoted:
            names.add(current.split("=", 1)[0].strip().lower())
            current = ""
        else:
            current += char
    return names - {""}


def is_restricted(options: str) -> bool:
    """No port forwarding and no X11 forwarding: `restrict` (unless re-enabled), or both no-* options."""
    names = option_names(options)
    if "restrict" in names:
        return not names & {"port-forwarding", "x11-forwarding"}
    return {"no-port-forwarding", "no-x11-forwarding"} <= names


def _fingerprint(blob: str) -> str:
    try:
        digest = hashlib.sha256(base64.b64decode(blob, validate=True)).digest()
    except ValueError:
        return ""
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# -- Jupyter configuration --------------------------------------------------------------------

JUPYTER_CLASSES = ("ServerApp", "NotebookApp", "IdentityProvider", "PasswordIdentityProvider",
                   "ZMQChannelsWebsocketConnection", "FileContentsManager")
JUPYTER_OPTIONS = ("token", "password", "hashed_password", "ip", "port", "iopub_data_rate_limit", "limit_rate",
                   "root_dir", "notebook_dir", "allow_remote_access", "password_required", "autosave_interval")
SECRET_OPTIONS = {"token", "password", "hashed_password"}
JUPYTER_BASENAMES = ("jupyter_notebook_config", "jupyter_lab_config", "jupyter_server_config")

_PY_ASSIGNMENT = re.compile(r"^c\.(\w+)\.(\w+)\s*=\s*(.+?)\s*$")


def parse_jupyter_py(text: str, path: str) -> dict[str, str]:
    """`c.ServerApp.token = ''` lines of a jupyter_*_config.py (later lines override earlier)."""
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        match = _PY_ASSIGNMENT.match(raw.strip())
        if not match or match.group(1) not in JUPYTER_CLASSES or match.group(2) not in JUPYTER_OPTIONS:
            continue
        cls, option, source = match.groups()
        _record(found, f"{cls}.{option}", _literal(_strip_comment(source)), f"{path}:{number}")
    return found


def parse_jupyter_json(text: str, path: str) -> dict[str, str]:
    """{"ServerApp": {"token": ""}} of a jupyter_*_config.json."""
    found: dict[str, str] = {}
    data = json.loads(text)
    if not isinstance(data, dict):
        return found
    for cls, options in data.items():
        if cls not in JUPYTER_CLASSES or not isinstance(options, dict):
            continue
        for option, value in options.items():
            if option in JUPYTER_OPTIONS:
                _record(found, f"{cls}.{option}", value, path)
    return found


_UNKNOWN = object()


def _strip_comment(source: str) -> str:
    """The expression before a trailing # comment (a # inside quotes stays)."""
    quote = None
    for i, char in enumerate(source):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return source[:i].strip()
    return source


def _literal(source: str) -> Any:
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return _UNKNOWN  # os.environ[...], a function call: not knowable without running it


def _record(found: dict[str, str], key: str, value: Any, where: str) -> None:
    found[key] = _shown(key.rsplit(".", 1)[1], value)
    found[f"{key}.at"] = where


def _shown(option: str, value: Any) -> str:
    """A config value as the audit keeps it: secrets only as (set) / (empty)."""
    if value is _UNKNOWN:
        return EXPRESSION
    if option in SECRET_OPTIONS:
        return SET if value else EMPTY
    return str(value)


def jupyter_config_files(user_dir: str, system_dirs: list[str]) -> list[str]:
    """Candidate config files, lowest priority first: system directories, then the user's;
    .py before .json in each (Jupyter loads them in this order, later values override)."""
    return [os.path.join(directory, base + ext)
            for directory in [*reversed(system_dirs), user_dir]
            for base in JUPYTER_BASENAMES for ext in (".py", ".json")]


def read_jupyter_config(paths: list[str], read: Read) -> tuple[dict[str, str], list[str]]:
    """Merged options of the files that exist, and those files."""
    merged: dict[str, str] = {}
    present = []
    for path in paths:
        text = read(path)
        if text is None:
            continue
        present.append(path)
        merged.update(parse_jupyter_json(text, path) if path.endswith(".json") else parse_jupyter_py(text, path))
    return merged, present


def jupyter_cli_options(cmdline: list[str]) -> dict[str, str]:
    """Options given on a Jupyter command line, as "<Class>.<option>" (aliases --ip, --port,
    --notebook-dir under their ServerApp names); secrets as (set) / (empty)."""
    aliases = {"ip": "ServerApp.ip", "port": "ServerApp.port", "notebook-dir": "ServerApp.root_dir"}
    found: dict[str, str] = {}
    args = list(cmdline)
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, has_value, value = arg[2:].partition("=")
        if not has_value:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                continue
            value = args[i + 1]
        key = aliases.get(name, name)
        cls, _, option = key.rpartition(".")
        if cls in JUPYTER_CLASSES and option in JUPYTER_OPTIONS:
            found[key] = _shown(option, _unquote(value))
    return found


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def _first(options: Mapping[str, str], option: str, classes: Iterable[str] = JUPYTER_CLASSES) -> tuple[str, str] | None:
    """(value, class) of `option` under the first class that sets it."""
    for cls in classes:
        if f"{cls}.{option}" in options:
            return options[f"{cls}.{option}"], cls
    return None


def jupyter_protection(cli: Mapping[str, str], env: Mapping[str, str], config: Mapping[str, str],
                       cmdline: list[str]) -> tuple[bool | None, str]:
    """Is this Jupyter server protected by a token or password? (protected, how we know).

    The command line overrides the environment (JUPYTER_TOKEN), which overrides config files.
    With no token configured anywhere Jupyter generates a random one: protected.
    """
    if any("jupyterhub-singleuser" in arg for arg in cmdline) or env.get("JUPYTERHUB_API_TOKEN") == SET:
        return True, "a JupyterHub single-user server: JupyterHub authenticates its users"
    for source, options in (("command line", cli), ("config", config)):
        for option in ("password", "hashed_password"):
            found = _first(options, option)
            if found and found[0] in (SET, EXPRESSION):
                return True, f"{found[1]}.{option} set ({_where(source, options, found[1], option)})"
    token = _first(cli, "token")
    if token:
        return _token_verdict(token[0], f"{token[1]}.token on the command line")
    # An empty JUPYTER_TOKEN is unset to Jupyter (`os.getenv("JUPYTER_TOKEN")` is falsy: it makes a
    # random token), not a disabled one; only `--ServerApp.token=''` or a config's '' disables it.
    if env.get("JUPYTER_TOKEN") not in (None, EMPTY):
        return _token_verdict(env["JUPYTER_TOKEN"], "JUPYTER_TOKEN in the server's environment")
    token = _first(config, "token")
    if token:
        return _token_verdict(token[0], f"{token[1]}.token in {config.get(f'{token[1]}.token.at', 'a config file')}")
    return True, "no token configured: Jupyter makes a random one at start (its default)"


def _token_verdict(value: str, where: str) -> tuple[bool | None, str]:
    if value == SET:
        return True, f"token set ({where})"
    if value == EMPTY:
        return False, f"token disabled: empty {where}, and no password"
    return None, f"token from an expression ({where}): cannot tell whether it is empty"


def _where(source: str, options: Mapping[str, str], cls: str, option: str) -> str:
    return options.get(f"{cls}.{option}.at", source)


# -- listeners -------------------------------------------------------------------------------

@dataclass
class ProcessView:
    """What the audit needs to know about a process (None where it could not be read)."""

    name: str | None = None
    cmdline: list[str] = field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # JUPYTER_TOKEN etc. as (set) / (empty)
    exe: str | None = None  # /proc/PID/exe: the interpreter it runs (resolved: a venv's is its base)


JUPYTER_PORTS = range(8888, 8900)
_JUPYTER_COMMAND = re.compile(r"jupyter[-_ ]?(lab|notebook|server)\b|jupyterhub-singleuser|nbclassic|-m (jupyterlab|notebook)\b")
_KINDS_BY_PORT = {22: "ssh", 6006: "tensorboard", 8265: "ray-dashboard"}


def server_kind(port: int, view: ProcessView | None) -> tuple[str | None, str | None]:
    """(kind, how it was recognised when not by its command line): jupyter, ssh, tensorboard,
    ray-dashboard, code-server, or None."""
    if view is not None and (view.name or view.cmdline):
        kind = _kind_from_command(view)
        if kind:
            return kind, None
        if port == 22 and (view.name or "") in ("systemd", "init"):
            return "ssh", "recognised by its port (socket-activated by systemd)"
        return None, None  # a process we can read and do not know: not guessed from its port
    kind = "jupyter" if port in JUPYTER_PORTS else _KINDS_BY_PORT.get(port)
    return kind, "recognised by its port only (process not readable)" if kind else None


# Python's built-in file servers: everything under their folder to whoever connects.
_FILE_SERVER_COMMAND = re.compile(r"-m\s+(http\.server|SimpleHTTPServer)\b")
# Daemons that let no one in without credentials of their own (not a password gpuvet could check):
# name -> how they authenticate. Keeps them out of the "open server" warnings.
AUTHENTICATED_DAEMONS = {"kubelet": "TLS client certificates", "tailscaled": "WireGuard keys of the tailnet",
                         "xrdp": "a desktop login", "xrdp-sesman": "a desktop login"}


def _kind_from_command(view: ProcessView) -> str | None:
    command = " ".join(view.cmdline).lower() or (view.name or "").lower()
    name = (view.name or "").lower()
    if _JUPYTER_COMMAND.search(command):
        return "jupyter"
    if "tensorboard" in command:
        return "tensorboard"
    if name in ("sshd", "dropbear") or name.startswith("sshd:") or command.startswith("sshd:"):
        return "ssh"
    if _FILE_SERVER_COMMAND.search(" ".join(view.cmdline)):
        return "file-server"
    iperf3_server = name == "iperf3" and ("-s" in view.cmdline or "--server" in view.cmdline)
    if iperf3_server or re.search(r"gpuvet\S*\s+net\s+serve\b", command):
        return "test-server"
    if "code-server" in command:
        return "code-server"
    if "ray" in command and "dashboard" in command:
        return "ray-dashboard"
    return None


def is_all_interfaces(address: str) -> bool:
    return address in ("0.0.0.0", "::", "", "*")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


def listeners_from(connections: Iterable[Any], process_of: Callable[[int], ProcessView | None],
                   jupyter_config: Mapping[str, str], code_server_auth: str | None = None) -> list[Listener]:
    """TCP listeners from psutil.net_connections-like entries (laddr=(ip, port), status, pid)."""
    seen, listeners = set(), []
    for conn in connections:
        if getattr(conn, "status", None) != "LISTEN" or not conn.laddr:
            continue
        address, port = conn.laddr[0], conn.laddr[1]
        pid = getattr(conn, "pid", None)
        if (address, port, pid) in seen:
            continue
        seen.add((address, port, pid))
        view = process_of(pid) if pid else None
        listeners.append(_listener(address, port, pid, view, jupyter_config, code_server_auth))
    return sorted(listeners, key=lambda item: (item.port, item.address))


def _listener(address: str, port: int, pid: int | None, view: ProcessView | None,
              jupyter_config: Mapping[str, str], code_server_auth: str | None) -> Listener:
    kind, recognised = server_kind(port, view)
    listener = Listener(address=address, port=port, pid=pid, process=view.name if view else None,
                        all_interfaces=is_all_interfaces(address), kind=kind)
    notes = [recognised] if recognised else []
    if kind == "jupyter" and view is not None and view.cmdline:
        listener.protected, how = jupyter_protection(jupyter_cli_options(view.cmdline), view.env, jupyter_config, view.cmdline)
        notes.append(how)
    elif kind == "jupyter":
        notes.append("cannot tell whether it has a token")
    elif kind in ("tensorboard", "ray-dashboard"):
        listener.protected = False
        notes.append(f"{kind} has no login of its own")
    elif kind == "code-server":
        auth = _code_server_auth(view.cmdline if view else [], code_server_auth)
        listener.protected = auth != "none"
        notes.append(f"auth: {auth}")
    elif kind == "ssh":
        listener.protected = True
        notes.append("login rules: see sshd settings")
    elif kind == "test-server":
        notes.append("a network test server (gpuvet net serve, iperf3 -s): runs no code, serves no files")
    elif kind == "file-server" and view is not None:  # recognised by its command line only
        listener.protected = False
        notes.append(f"serves every file under {served_folder(view.cmdline, view.cwd)}")
    elif view is not None and view.name is not None and view.name in AUTHENTICATED_DAEMONS:
        listener.protected = True
        notes.append(f"{view.name} authenticates with {AUTHENTICATED_DAEMONS[view.name]}")
    listener.note = "; ".join(notes) or None
    return listener


def served_folder(cmdline: list[str], cwd: str | None) -> str:
    """The folder `python3 -m http.server` serves: --directory/-d DIR, else its working directory."""
    for i, arg in enumerate(cmdline):
        if arg.startswith("--directory="):
            folder = arg.split("=", 1)[1]
        elif arg in ("-d", "--directory") and i + 1 < len(cmdline):
            folder = cmdline[i + 1]
        else:
            continue
        return folder if os.path.isabs(folder) or not cwd else os.path.join(cwd, folder)
    return cwd or "its working directory"


def _code_server_auth(cmdline: list[str], config_auth: str | None) -> str:
    for i, arg in enumerate(cmdline):
        if arg.startswith("--auth="):
            return arg.split("=", 1)[1]
        if arg == "--auth" and i + 1 < len(cmdline):
            return cmdline[i + 1]
    return config_auth or "password (code-server's default)"


def parse_code_server_auth(text: str) -> str | None:
    """`auth: none|password` of ~/.config/code-server/config.yaml; YAML allows the value quoted
    (`auth: "none"`) and a comment after it."""
    match = re.search(r"^auth:[ \t]*(?P<q>[\"']?)(?P<value>[^\"'#\s]*)(?P=q)", text, re.MULTILINE)
    return match.group("value").lower() if match and match.group("value") else None


# -- Jupyter extensions and autosave (seed 2, 6.4: switch off resource monitors and autosave) -----

# Server extensions that poll `ps` and nvidia-smi every few seconds (the seed: nbresuse every 5 s).
RESOURCE_MONITORS = ("jupyter_resource_usage", "nbresuse")
_EXTENSION_OPTIONS = (("ServerApp", "jpserver_extensions"), ("NotebookApp", "nbserver_extensions"))


def enabled_extensions(files: list[tuple[str, str]]) -> dict[str, str]:
    """Resource-monitor extensions enabled by Jupyter's config.d JSON files or main config files
    (`files`: (path, text) in load order, later ones override): name -> the file that enabled it.
    An empty dict assigned in a config (`c.NotebookApp.nbserver_extensions = {}`, the seed's line)
    turns them all off."""
    enabled: dict[str, str] = {}
    for path, text in files:
        for options in _extension_dicts(path, text):
            if not options:
                enabled.clear()
            for name, on in options.items():
                if name not in RESOURCE_MONITORS:
                    continue
                if on:
                    enabled[name] = path
                else:
                    enabled.pop(name, None)
    return enabled


def _extension_dicts(path: str, text: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError:
            return found
        for cls, option in _EXTENSION_OPTIONS:
            value = (data.get(cls) or {}).get(option) if isinstance(data, dict) and isinstance(data.get(cls), dict) else None
            if isinstance(value, dict):
                found.append(value)
        return found
    for raw in text.splitlines():
        match = _PY_ASSIGNMENT.match(raw.strip())
        if match and (match.group(1), match.group(2)) in _EXTENSION_OPTIONS:
            value = _literal(_strip_comment(match.group(3)))
            if isinstance(value, dict):
                found.append(value)
    return found


_LAB_AUTOSAVE = "lab/user-settings/@jupyterlab/docmanager-extension/plugin.jupyterlab-settings"


def autosave_setting(config: Mapping[str, str], lab_settings: str | None) -> str:
    """ "off" or "on (every N s, where)" from JupyterLab's document-manager settings (JSON with
    comments) or a config's autosave_interval (the seed's c.NotebookApp.autosave_interval = 0)."""
    if lab_settings:
        body = re.sub(r"^\s*//.*$", "", lab_settings, flags=re.M)
        flag = re.search(r'"autosave"\s*:\s*(true|false)', body)
        interval = re.search(r'"autosaveInterval"\s*:\s*(\d+)', body)
        if flag and flag.group(1) == "false":
            return f"off (JupyterLab settings, ~/.jupyter/{_LAB_AUTOSAVE})"
        if interval:
            return "off (autosaveInterval 0)" if interval.group(1) == "0" else f"on (every {interval.group(1)} s, JupyterLab settings)"
    for cls in ("ServerApp", "NotebookApp", "FileContentsManager"):
        value = config.get(f"{cls}.autosave_interval")
        if value is not None:
            where = config.get(f"{cls}.autosave_interval.at", "config")
            return f"off ({where})" if value in ("0", "0.0") else f"on (every {value} s, {where})"
    return "on (JupyterLab's default: every 120 s)"


# -- the running server's own installation -------------------------------------------------------

# What decides which config a server reads and which extensions it loads: the packages installed
# where the server runs from, not where gpuvet runs.
SERVER_PACKAGES = ("jupyter_server", "notebook", "nbclassic", "jupyterlab", *RESOURCE_MONITORS)
_DIST_INFO = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[0-9][^-]*)\.dist-info$")


def server_prefix(view: ProcessView) -> str | None:
    """The environment a server runs from: the `bin/` of its script or interpreter on the command line
    (a venv's `bin/jupyter-lab`), else of /proc/PID/exe (a conda or system Python)."""
    for arg in [*view.cmdline[:2], view.exe or ""]:
        if os.path.isabs(arg) and os.path.basename(os.path.dirname(arg)) == "bin":
            base = os.path.basename(arg)
            if base.startswith(("python", "jupyter")):
                return os.path.dirname(os.path.dirname(arg))
    return None


def installed_packages(prefix: str, glob: Glob) -> dict[str, str]:
    """SERVER_PACKAGES installed in `prefix` -> version, from their .dist-info folder names."""
    found: dict[str, str] = {}
    for path in sorted(glob(f"{prefix}/lib/python3*/site-packages/*.dist-info")):
        m = _DIST_INFO.match(os.path.basename(path))
        if m and m.group("name").lower().replace("-", "_") in SERVER_PACKAGES:
            found.setdefault(m.group("name").lower().replace("-", "_"), m.group("version"))
    return found


def _major(version: str | None) -> int | None:
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else None


def reads_notebook_app(view: ProcessView | None, packages: Mapping[str, str]) -> bool:
    """Whether the server reads NotebookApp.* options: the classic Notebook (< 7, or nbclassic)
    does; a jupyter-server 2 application (JupyterLab, Notebook 7) ignores them and
    jupyter_notebook_config.py. Unknown packages: assumed to read them, as before."""
    server = _major(packages.get("jupyter_server"))
    if server is None or server < 2:
        return True
    classic = " ".join(view.cmdline) if view else ""
    return "nbclassic" in classic or (re.search(r"\bnotebook\b", classic) is not None
                                      and (_major(packages.get("notebook")) or 7) < 7)


# -- effective Jupyter settings -----------------------------------------------------------------

def jupyter_settings(config: Mapping[str, str], servers: list[tuple[Listener, ProcessView | None]],
                     packages: Mapping[str, str] | None = None) -> dict[str, str]:
    """iopub rate limit and notebook directory as the running server (first found) uses them:
    its command line over the config files; its working directory when neither sets a root.
    `packages`: what is installed where the server runs (installed_packages)."""
    settings: dict[str, str] = {"running": "yes" if servers else "no"}
    cli: Mapping[str, str] = {}
    view = None
    if servers:
        listener, view = servers[0]
        settings["server"] = f"{listener.process or 'jupyter'} pid {listener.pid} on {listener.address}:{listener.port}"
        cli = jupyter_cli_options(view.cmdline) if view else {}
    classes: tuple[str, ...] = ("ZMQChannelsWebsocketConnection", "ServerApp", "NotebookApp")
    if packages:
        settings["server_packages"] = ", ".join(f"{name} {version}" for name, version in sorted(packages.items()))
        if not reads_notebook_app(view, packages):
            classes = classes[:2]
            settings["notebook_app_ignored"] = (f"jupyter_server {packages['jupyter_server']} ignores NotebookApp.* options "
                                                "and jupyter_notebook_config.py (use ServerApp.* in jupyter_server_config.py)")
    for option in ("iopub_data_rate_limit", "limit_rate"):
        for source in (cli, config):
            found = _first(source, option, classes)
            if found:
                settings[option] = found[0]
                settings[f"{option}.at"] = source.get(f"{found[1]}.{option}.at", "command line")
                break
    for source in (cli, config):
        found = _first(source, "root_dir", ("ServerApp",)) or _first(source, "notebook_dir", ("ServerApp", "NotebookApp"))
        if found and found[0] != EXPRESSION:
            settings["root_dir"] = found[0]
            settings["root_dir.at"] = next((source[k] for k in (f"{found[1]}.root_dir.at", f"{found[1]}.notebook_dir.at")
                                            if k in source), "command line")
            break
    else:
        if view is not None and view.cwd:
            settings["root_dir"], settings["root_dir.at"] = view.cwd, "the server's working directory"
    return settings


# -- environment ----------------------------------------------------------------------------

ENV_VARS = ("CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
            "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG",
            "HF_HOME", "TORCH_HOME", "JUPYTER_CONFIG_DIR")
SECRET_ENV_VARS = ("JUPYTER_TOKEN", "JUPYTERHUB_API_TOKEN")


def environment_of(environ: Mapping[str, str]) -> dict[str, str]:
    shown = {name: environ[name] for name in ENV_VARS if name in environ}
    shown |= {name: SET if environ[name] else EMPTY for name in SECRET_ENV_VARS if name in environ}
    return shown


# -- collection ------------------------------------------------------------------------------

def _why(error: BaseException) -> str:
    if isinstance(error, PermissionError):
        return f"permission denied: {error.filename or error}"
    return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def _isolated(unavailable: dict[str, str], part: str):
    try:
        yield
    except Exception as error:  # an audit must never stop the run
        unavailable[part] = _why(error)


def _file_reader(etc: str) -> Read:
    """Read a file; None when it does not exist. Paths under /etc are read under `etc`, so a
    mounted system image (or a test's fake /etc) is audited as a whole."""
    def read(path: str) -> str | None:
        path = _rebase(path, etc)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
    return read


def _file_glob(etc: str, home: str) -> Glob:
    def glob(pattern: str) -> list[str]:
        if pattern == "~" or pattern.startswith("~/"):  # the audited user's home, not ours
            pattern = home + pattern[1:]
        return globlib.glob(_rebase(pattern, etc))
    return glob


def _rebase(path: str, etc: str) -> str:
    if etc.rstrip("/") != "/etc" and (path == "/etc" or path.startswith("/etc/")):
        return etc.rstrip("/") + path[len("/etc"):]
    return path


def collect_audit(home: str | None = None, etc: str = "/etc", *, environ: Mapping[str, str] | None = None) -> Audit:
    """Read the audit of this machine for the user whose home is `home` (default: ours)."""
    audit = Audit()
    notes = audit.unavailable
    home = home or os.path.expanduser("~")
    environ = os.environ if environ is None else environ
    read, glob = _file_reader(etc), _file_glob(etc, home)
    with _isolated(notes, "environment"):
        audit.environment = environment_of(environ)
    with _isolated(notes, "ssh_client"):
        audit.ssh_client = parse_ssh_client_config([f"{home}/.ssh/config", f"{etc}/ssh/ssh_config"], read, glob, f"{home}/.ssh")
    with _isolated(notes, "sshd"):
        _fill_sshd(audit, etc, read, glob)
    with _isolated(notes, "authorized_keys"):
        _fill_authorized_keys(audit, home, read)
    config: dict[str, str] = {}
    with _isolated(notes, "jupyter"):
        config, files = read_jupyter_config(_jupyter_config_paths(home, etc, environ), read)
        audit.jupyter.update(config)
        audit.jupyter["config_files"] = ", ".join(files)
    with _isolated(notes, "jupyter.extensions"):
        _fill_jupyter_extensions(audit, config, home, etc, environ, read, glob)
    with _isolated(notes, "listeners"):
        code_server = read(f"{home}/.config/code-server/config.yaml")
        audit.listeners = listeners_from(_net_connections(), _remembered(_process_view), config,
                                         parse_code_server_auth(code_server) if code_server else None)
    with _isolated(notes, "jupyter.settings"):
        _fill_jupyter_settings(audit, config, glob, read)
    return audit


def _fill_sshd(audit: Audit, etc: str, read: Read, glob: Glob) -> None:
    main = f"{etc}/ssh/sshd_config"
    if read(main) is None:
        audit.unavailable["sshd"] = f"no {main} (no OpenSSH server installed)"
        return
    audit.sshd = parse_sshd_config(main, read, glob, base_dir=f"{etc}/ssh")


def _fill_authorized_keys(audit: Audit, home: str, read: Read) -> None:
    path = f"{home}/.ssh/authorized_keys"
    text = read(path)
    if text is None:
        audit.unavailable["authorized_keys"] = f"no {path}"
        return
    audit.authorized_keys = parse_authorized_keys(text)


def _jupyter_dirs(home: str, etc: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    user_dir = environ.get("JUPYTER_CONFIG_DIR") or f"{home}/.jupyter"
    system_dirs = [f"{etc}/jupyter"]
    if etc.rstrip("/") == "/etc":  # the real machine: also where pip and conda put system config
        system_dirs = [f"{sys.prefix}/etc/jupyter", "/usr/local/etc/jupyter", *system_dirs]
    return user_dir, system_dirs


def _jupyter_config_paths(home: str, etc: str, environ: Mapping[str, str]) -> list[str]:
    return jupyter_config_files(*_jupyter_dirs(home, etc, environ))


def _fill_jupyter_extensions(audit: Audit, config: Mapping[str, str], home: str, etc: str,
                             environ: Mapping[str, str], read: Read, glob: Glob) -> None:
    """Resource monitors enabled (config.d files as pip installs them, then the main configs) and
    the autosave setting, into audit.jupyter["resource_monitors"] and ["autosave"]."""
    user_dir, system_dirs = _jupyter_dirs(home, etc, environ)
    files: list[tuple[str, str]] = []
    for directory in [*reversed(system_dirs), user_dir]:
        for sub in ("jupyter_notebook_config.d", "jupyter_server_config.d"):
            for path in sorted(glob(f"{directory}/{sub}/*.json")):
                text = read(path)
                if text is not None:
                    files.append((path, text))
        for base in JUPYTER_BASENAMES:
            for ext in (".py", ".json"):
                text = read(os.path.join(directory, base + ext))
                if text is not None:
                    files.append((os.path.join(directory, base + ext), text))
    monitors = enabled_extensions(files)
    if monitors:
        audit.jupyter["resource_monitors"] = ", ".join(f"{name} ({path})" for name, path in monitors.items())
    if files or audit.jupyter.get("config_files"):
        audit.jupyter["autosave"] = autosave_setting(config, read(f"{user_dir}/{_LAB_AUTOSAVE}"))


def _fill_jupyter_settings(audit: Audit, config: Mapping[str, str], glob: Glob, read: Read) -> None:
    from .host import storage_for

    servers = [(item, _process_view(item.pid) if item.pid else None) for item in audit.listeners if item.kind == "jupyter"]
    view = servers[0][1] if servers else None
    prefix = server_prefix(view) if view else None
    packages = installed_packages(prefix, glob) if prefix else {}
    settings = jupyter_settings(config, servers, packages)
    if prefix and not audit.jupyter.get("resource_monitors"):
        server_resource_monitors(audit, prefix, packages, glob, read)
    root = settings.get("root_dir")
    if root and not root.startswith("("):
        storage = storage_for(os.path.expanduser(root))
        settings["root_dir.fs_type"] = storage.fs_type or "unknown"
        settings["root_dir.kind"] = storage.kind or "unknown"
        if storage.ephemeral:
            settings["root_dir.ephemeral"] = storage.ephemeral_reason or "ephemeral"
    audit.jupyter.update(settings)


def server_resource_monitors(audit: Audit, prefix: str, packages: Mapping[str, str], glob: Glob, read: Read) -> None:
    """A resource monitor installed and enabled in the server's own environment (pip puts its
    enabling file in <prefix>/etc/jupyter/jupyter_server_config.d), which gpuvet's own does not see."""
    if not any(name in packages for name in RESOURCE_MONITORS):
        return
    files = []
    for sub in ("jupyter_notebook_config.d", "jupyter_server_config.d"):
        for path in sorted(glob(f"{prefix}/etc/jupyter/{sub}/*.json")):
            text = read(path)
            if text is not None:
                files.append((path, text))
    monitors = enabled_extensions(files)
    if monitors:
        audit.jupyter["resource_monitors"] = ", ".join(f"{name} ({path})" for name, path in monitors.items())


def _remembered(look_up: Callable[[int], ProcessView | None]) -> Callable[[int], ProcessView | None]:
    """`look_up` once per pid (a server often listens on several addresses)."""
    seen: dict[int, ProcessView | None] = {}

    def once(pid: int) -> ProcessView | None:
        if pid not in seen:
            seen[pid] = look_up(pid)
        return seen[pid]
    return once


def _net_connections() -> list[Any]:
    import psutil

    return psutil.net_connections(kind="tcp")


def _process_view(pid: int) -> ProcessView | None:
    """Name, command line, working directory and token variables of `pid`, where permitted."""
    import psutil

    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return None
    view = ProcessView()
    for attribute, read in (("name", process.name), ("cmdline", process.cmdline), ("cwd", process.cwd), ("exe", process.exe)):
        with contextlib.suppress(psutil.Error, OSError):
            setattr(view, attribute, read())
    with contextlib.suppress(psutil.Error, OSError):
        view.env = environment_of(process.environ())
    return view
