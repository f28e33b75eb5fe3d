"""Redaction for sharing: no UUID, serial, hostname, IP or MAC address survives in any output."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvet.record import WARN, Finding, RunRecord
from gpuvet.report import terminal
from gpuvet.report.html import render_html
from gpuvet.report.markdown import render_markdown
from gpuvet.report.redact import Redactor, redact

RECORDS = Path(__file__).parent / "fixtures" / "records"
HOSTNAME = "gpu-node-17.example.internal"  # the hostname cpu-quick.json was recorded under


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def outputs(r: RunRecord) -> dict[str, str]:
    console = Console(record=True, width=300, highlight=False, soft_wrap=True, color_system=None)
    terminal.render(r, console, verbose=True)
    return {"json": r.to_json(), "terminal": console.export_text(), "markdown": render_markdown(r), "html": render_html(r)}


def test_the_8x_h100_capture_loses_every_uuid_and_serial_in_every_format():
    original = record("h100-8x-throttle")
    secrets = [g.uuid for g in original.machine.gpus] + [g.serial for g in original.machine.gpus]
    assert all(secrets) and len(set(secrets)) == 16
    assert all(s in outputs(original)["html"] for s in secrets)  # they are there before
    # Synthetic: the same identifiers in free text too, as a provider's note might carry them.
    original.findings.append(Finding("gpu.isolation", "gpu2", WARN, f"GPU {secrets[2]} (serial {secrets[10]}) seen from 10.20.30.40",
                                     remedy=f"ssh admin@10.20.30.40 nvidia-smi -i {secrets[2]}"))
    shared = redact(original)
    for name, text in outputs(shared).items():
        for secret in secrets:
            assert secret not in text, (name, secret)
        assert "10.20.30.40" not in text, name
    uuids = [g.uuid for g in shared.machine.gpus]
    assert uuids == [f"GPU-REDACTED-{i}" for i in range(1, 9)]
    assert [g.serial for g in shared.machine.gpus] == [f"SERIAL-REDACTED-{i}" for i in range(1, 9)]
    note = shared.findings[-1]
    assert note.summary == "GPU GPU-REDACTED-3 (serial SERIAL-REDACTED-3) seen from IPV4-REDACTED-1"
    assert note.remedy == "ssh admin@IPV4-REDACTED-1 nvidia-smi -i GPU-REDACTED-3"


def test_the_hostname_of_a_live_run_is_gone_everywhere_and_the_rest_reads_the_same():
    original = record("cpu-quick")
    assert original.machine.host.hostname == HOSTNAME
    # Synthetic: the hostname and its short form where people meet it, in a path and a process note.
    original.machine.host.workdir.path = f"/home/alice/runs/{HOSTNAME}/ckpt"
    original.findings.append(Finding("host.cpu", "host", WARN, "gpu-node-17 has 2 cores; see /home/alice/notes.txt"))
    before = copy.deepcopy(original.to_dict())
    shared = redact(original)
    assert original.to_dict() == before  # a copy: the record passed in is untouched
    assert shared.machine.host.hostname == "HOST-REDACTED-1"
    for name, text in outputs(shared).items():
        assert not re.search(r"gpu-node-17", text, re.I), name
        assert "alice" not in text, name
    assert shared.machine.host.workdir.path == "/home/USER-REDACTED-1/runs/HOST-REDACTED-1/ckpt"
    assert shared.findings[-1].summary == "HOST-REDACTED-1 has 2 cores; see /home/USER-REDACTED-1/notes.txt"
    assert [f.summary for f in shared.findings[:-1]] == [f.summary for f in original.findings[:-1]]
    assert shared.verdict == original.verdict and shared.options["redacted"] is True
    assert "· redacted" in outputs(shared)["terminal"].splitlines()[0]


def test_capture_paths_series_and_measurement_details_are_walked_too():
    r = record("h100-8x-synthetic-sustained")
    gpu0 = r.machine.gpus[0].uuid
    r.machine.captures.append({"path": f"/home/bob/caps/{gpu0}.xml", "kind": "smi-xml"})
    r.measurements[0].details["host"] = "node at fe80::1c2d:3eff:fe4f:5a6b%eth0, mac 0c:42:a1:5e:77:10"
    r.series[0]["note"] = f"sampled on {gpu0}"
    shared = redact(r)
    text = shared.to_json()
    assert gpu0 not in text and "bob" not in text and "fe80::" not in text and "0c:42:a1" not in text
    assert shared.machine.captures[-1]["path"] == "/home/USER-REDACTED-1/caps/GPU-REDACTED-1.xml"
    assert shared.measurements[0].details["host"] == "node at IPV6-REDACTED-1, mac MAC-REDACTED-1"
    assert len(shared.series) == len(r.series) and shared.series[0]["rows"] == r.series[0]["rows"]


@pytest.mark.parametrize(("before", "after"), [
    ("ssh root@192.168.1.20:22", "ssh root@IPV4-REDACTED-1:22"),
    ("peer 2001:db8::8a2e:370:7334.", "peer IPV6-REDACTED-1."),
    ("mapped ::ffff:10.0.0.5 and link fe80::1%eth0", "mapped IPV6-REDACTED-1 and link IPV6-REDACTED-2"),
    ("MACs aa:bb:cc:dd:ee:ff and AA-BB-CC-DD-EE-FF", "MACs MAC-REDACTED-1 and MAC-REDACTED-1"),
    ("MIG-4b5a8f5d-1a2b-5c3d-9e8f-0123456789ab and 4b5a8f5d-1a2b-5c3d-9e8f-0123456789ab",
     "MIG-REDACTED-1 and UUID-REDACTED-1"),
    # What must stay: loopback and any-address listeners, bus ids, times, versions, VBIOS.
    ("Jupyter on 0.0.0.0:8888 and [::]:22, 127.0.0.1 and ::1", "Jupyter on 0.0.0.0:8888 and [::]:22, 127.0.0.1 and ::1"),
    ("bus 0000:01:00.0 at 16:41:05, driver 535.183.01, VBIOS 96.00.99.00.01, CUDA 12.2",
     "bus 0000:01:00.0 at 16:41:05, driver 535.183.01, VBIOS 96.00.99.00.01, CUDA 12.2"),
])
def test_addresses_and_identifiers_in_text(before, after):
    assert Redactor().text(before) == after


def test_a_short_hostname_does_not_eat_ordinary_words():
    r = Redactor()
    r.learn({"hostname": "vm"})
    assert r.text("kvm VM guest; ssh vm; vmstat 1") == "kvm VM guest; ssh HOST-REDACTED-1; vmstat 1"


def test_a_hostname_beside_a_dash_or_underscore_is_redacted_but_not_another_host():
    r = Redactor()
    r.learn({"hostname": HOSTNAME})
    assert r.text("/scratch/gpu-node-17-tmp and /tmp/gpu-node-17_ckpt, not gpu-node-170") == \
        "/scratch/HOST-REDACTED-1-tmp and /tmp/HOST-REDACTED-1_ckpt, not gpu-node-170"


# -- what round two of the hostile-input tests kept (issue 30) -------------------------------------
# A corpus of identifiers as they appear in shared reports: each must be gone, in every format.
CORPUS = {
    "IPv6 with a port": ("listening on 2001:db8:85a3::8a2e:370:7334:8443", "2001:db8:85a3"),
    "IPv6 bracketed with a port": ("peer [2001:db8::42]:5201", "2001:db8::42"),
    "a user under /nfs/home": ("/nfs/home/carol/ckpt", "carol"),
    "a user under /mnt/home": ("/mnt/home/dave/data", "dave"),
    "a user under /scratch": ("/scratch/erin42/run1", "erin42"),
    "an EC2 host name in a path": ("/data/ip-10-1-2-3.ec2.internal/q.xml", "ip-10-1-2-3"),
    "an AWS instance id in a path": ("/captures/i-0abc123def4567890/gpu.xml", "i-0abc123def4567890"),
    "a GKE node in a label": ("k8s node gke-prod-gpu-pool-7f3a9c1d-x2lq", "gke-prod-gpu-pool"),
    "an AKS node in a label": ("on aks-gpupool-12345678-vmss000003", "aks-gpupool"),
    "another host of a private zone": ("copied from node-b.cluster.local:/tmp", "node-b.cluster.local"),
    "a machine's folder in a capture's path": ("/data/captures/gpu-node-42/q.xml", "gpu-node-42"),
}


@pytest.mark.parametrize("where", sorted(CORPUS))
def test_an_identifier_is_gone_from_every_format_wherever_it_is(where):
    text, secret = CORPUS[where]
    original = record("cpu-quick")
    original.options["label"] = text
    original.machine.captures.append({"path": text, "kind": "smi-xml"})
    original.findings.append(Finding("host.cpu", "host", WARN, f"seen at {text}"))
    shared = redact(original)
    for name, rendered in outputs(shared).items():
        assert secret.lower() not in rendered.lower(), (name, where)


def test_what_the_record_knows_is_redacted_wherever_it_appears():
    """The user of a home directory in one path is that user in a remedy; net test's peer host is
    that host in a note; neither is a field the walk redacts by its key alone."""
    original = record("cpu-quick")
    original.machine.host.workdir.path = "/nfs/home/frank/runs"
    original.options["peer"] = "gpu-peer-03.example.org:5201"
    original.findings.append(Finding("host.cpu", "host", WARN, "ask frank; compare with gpu-peer-03 (gpu-peer-03.example.org)"))
    shared = redact(original)
    text = shared.to_json()
    assert "frank" not in text and "gpu-peer-03" not in text
    assert re.fullmatch(r"ask USER-REDACTED-\d+; compare with (HOST-REDACTED-\d+) \(\1\)", shared.findings[-1].summary)


def test_redaction_keeps_what_identifies_nobody():
    r = Redactor()
    r.learn({"path": "/scratch/data/x and /home/root/y"})
    kept = "docs.nvidia.com/deploy, gpu.xml, the data in root's shell, 0000:3b:00.0 at 16:41:05, [::]:22"
    assert r.text(kept) == kept


def test_a_cluster_nodes_name_is_redacted_where_it_appears():
    original = record("cpu-quick")
    original.options["cluster"] = {"id": "c1", "node": "dgx-b07", "rank": 1, "world_size": 2}
    original.findings.append(Finding("host.cpu", "host", WARN, "checkpoint on /lustre/dgx-b07/ckpt, as dgx-b07 sees it"))
    shared = redact(original)
    assert "dgx-b07" not in shared.to_json() and shared.options["cluster"]["rank"] == 1
