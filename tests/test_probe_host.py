"""Host probe: classifiers on documented inputs, then a live read of this machine.

The DMI signals (Azure asset tag, "Google Compute Engine", "Amazon EC2", ".metal", "OpenStack
Nova", ...) are those quoted in /work/shared/reference/cuda_nvml_facts.md §3.3 (systemd virt.c,
cloud-init ds-identify); the values around them (instance types, bare-metal server names) are
illustrative. The /proc/stat, cpuinfo and mountinfo strings are synthetic, written for these
tests: they are not captures of real machines.
"""

import os
import sys

import pytest

from gpuvet.probe import host as probe
from gpuvet.probe.host import (
    Mount,
    cloud_from_dmi,
    collect_host,
    container_from,
    cpu_model_from_cpuinfo,
    ephemeral_from,
    hypervisor_from,
    mount_for,
    parse_cfs_quota,
    parse_cpu_max,
    parse_cpu_times,
    parse_mountinfo,
    steal_percent,
    steal_since_boot_percent,
    storage_kind,
    usable_cores,
)

AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


# -- cloud and hypervisor from DMI ------------------------------------------------------------

@pytest.mark.parametrize("dmi, cloud, hypervisor", [
    ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine",
      "chassis_asset_tag": AZURE_ASSET_TAG}, "azure", "hyperv"),
    ({"product_name": "Google Compute Engine", "sys_vendor": "Google", "bios_vendor": "Google"},
     "gcp", "google"),
    ({"sys_vendor": "Amazon EC2", "product_name": "p4d.24xlarge", "bios_vendor": "Amazon EC2"},
     "aws", "nitro"),
    ({"sys_vendor": "Amazon EC2", "product_name": "m5.metal"}, "aws", None),
    ({"sys_vendor": "Amazon EC2", "product_name": "m7i.metal-24xl"}, "aws", None),
    ({"sys_vendor": "Xen", "product_name": "HVM domU", "bios_version": "4.2.amazon"}, "aws", "xen"),
    ({"product_name": "OpenStack Nova"}, "openstack", "kvm"),
    ({"product_name": "OpenStack Nova", "chassis_asset_tag": "HUAWEICLOUD"}, "huawei", "kvm"),
    ({"product_name": "Alibaba Cloud ECS", "sys_vendor": "Alibaba Cloud", "bios_vendor": "SeaBIOS"},
     "alibaba", None),
    ({"chassis_asset_tag": "OracleCloud.com"}, "oracle", None),
])
def test_cloud_and_hypervisor_from_documented_dmi(dmi, cloud, hypervisor):
    assert cloud_from_dmi(dmi) == cloud
    assert hypervisor_from(dmi, None, set()) == hypervisor


def test_hyperv_without_azure_asset_tag_is_not_azure():
    dmi = {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}
    assert cloud_from_dmi(dmi) is None
    assert hypervisor_from(dmi, None, {"hypervisor"}) == "hyperv"


@pytest.mark.parametrize("dmi", [
    {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR"},
    # Oracle's own servers: systemd would call this VirtualBox, which is wrong on OCI bare metal.
    {"sys_vendor": "Oracle Corporation", "product_name": "ORACLE SERVER E4-2c"},
])
def test_bare_metal_dmi_names_no_cloud_and_no_hypervisor(dmi):
    assert cloud_from_dmi(dmi) is None
    assert hypervisor_from(dmi, None, set()) is None


@pytest.mark.parametrize("dmi, sys_type, flags, clocksources, expected", [
    ({"sys_vendor": "QEMU"}, None, {"hypervisor"}, {"tsc", "kvm-clock"}, "kvm"),
    ({"sys_vendor": "QEMU"}, None, {"hypervisor"}, {"tsc"}, "qemu"),
    ({"sys_vendor": "VMware, Inc."}, None, {"hypervisor"}, set(), "vmware"),
    ({"product_version": "Hyper-V UEFI Release v4.1"}, None, set(), set(), "hyperv"),
    ({}, "xen\n", set(), set(), "xen"),
    ({}, None, {"hypervisor"}, {"tsc", "kvm-clock"}, "kvm"),
    ({}, None, {"fpu", "hypervisor"}, {"tsc"}, "unknown"),
    ({}, None, {"fpu", "sse2"}, {"tsc", "hpet"}, None),
])
def test_hypervisor_from_other_signals(dmi, sys_type, flags, clocksources, expected):
    assert hypervisor_from(dmi, sys_type, flags, clocksources) == expected


# -- container --------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerenv, containerenv, environ, cgroup, expected", [
    (True, False, {}, "0::/\n", "docker"),
    (False, True, {"container": "podman"}, "0::/\n", "podman"),
    (True, False, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "0::/\n", "kubernetes"),
    (False, False, {}, "12:cpu:/kubepods/burstable/pod1/abc\n", "kubernetes"),
    (False, False, {"container": "systemd-nspawn"}, "0::/\n", "systemd-nspawn"),
    (False, False, {}, "11:cpu:/docker/0123abcd\n", "docker"),
    (False, False, {}, "0::/lxc.payload.box\n", "lxc"),
    (False, False, {}, "0::/init.scope\n", None),
    (False, False, {}, None, None),
])
def test_container_from(dockerenv, containerenv, environ, cgroup, expected):
    assert container_from(dockerenv, containerenv, environ, cgroup) == expected


# -- CPU steal --------------------------------------------------------------------------------

# Synthetic /proc/stat: user nice system idle iowait irq softirq steal guest guest_nice.
SYNTHETIC_STAT_BEFORE = "cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 90 0 45 700 9 0 0 35 0 0\nintr 1\n"
SYNTHETIC_STAT_AFTER = "cpu  150 0 75 900 10 0 0 65 30 0\ncpu0 99 0 50 750 9 0 0 49 20 0\nintr 2\n"


def test_parse_cpu_times_reads_the_aggregate_line():
    assert parse_cpu_times(SYNTHETIC_STAT_BEFORE) == (100, 0, 50, 800, 10, 0, 0, 40, 0, 0)
    with pytest.raises(ValueError):
        parse_cpu_times("cpu0 1 2 3 4\n")


def test_steal_percent_excludes_guest_time():
    before, after = parse_cpu_times(SYNTHETIC_STAT_BEFORE), parse_cpu_times(SYNTHETIC_STAT_AFTER)
    # Δ user 50 + system 25 + idle 100 + steal 25 = 200; the 30 guest ticks are inside user.
    assert steal_percent(before, after) == pytest.approx(12.5)
    assert steal_since_boot_percent(after) == pytest.approx(100 * 65 / 1200)


def test_steal_percent_is_none_without_a_steal_column_or_elapsed_time():
    old_kernel = (100, 0, 50, 800, 10, 0, 0)
    assert steal_percent(old_kernel, old_kernel) is None
    same = parse_cpu_times(SYNTHETIC_STAT_BEFORE)
    assert steal_percent(same, same) is None


# -- CPU model and usable cores ---------------------------------------------------------------

def test_cpu_model_from_cpuinfo():
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) 8480+\n"
    assert cpu_model_from_cpuinfo(x86) == "Intel(R) Xeon(R) 8480+"
    grace = "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    assert cpu_model_from_cpuinfo(grace) == "ARM Neoverse-V2"
    other_arm = "processor\t: 0\nCPU implementer\t: 0x4e\nCPU part\t: 0x004\n"
    assert cpu_model_from_cpuinfo(other_arm) == "ARM implementer 0x4e part 0x004"
    assert cpu_model_from_cpuinfo("processor\t: 0\n") is None


def testcgroup_cpu_quota_parsing_and_usable_cores():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("200000 100000\n") == 2.0
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("50000\n", "100000\n") == 0.5
    assert usable_cores(8, None) == 8
    assert usable_cores(8, parse_cpu_max("150000 100000")) == 2  # 1.5 CPUs keep 2 cores busy
    assert usable_cores(8, 0.5) == 1
    assert usable_cores(2, 16.0) == 2  # the affinity set is the tighter limit


@pytest.mark.parametrize("proc_self_cgroup, files, expected", [
    # v2: the parent's 1.5 CPUs is tighter than the child's "max".
    ("0::/pod/app\n", {"pod/cpu.max": "150000 100000\n", "pod/app/cpu.max": "max 100000\n"}, 1.5),
    ("0::/\n", {"cpu.max": "400000 100000\n"}, 4.0),
    # v1 inside a container: /proc/self/cgroup names the host path, the mount root is ours.
    ("4:cpu,cpuacct:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "200000\n",
                                     "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ("4:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
     None),
])
def test_cgroup_quota_found_on_own_cgroup_or_ancestors(monkeypatch, tmp_path, proc_self_cgroup,
                                                       files, expected):
    (tmp_path / "self-cgroup").write_text(proc_self_cgroup)
    for name, content in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(content)
    monkeypatch.setattr(probe, "PROC_SELF_CGROUP", str(tmp_path / "self-cgroup"))
    monkeypatch.setattr(probe, "CGROUP_ROOT", str(tmp_path / "fs"))
    assert probe.cgroup_cpu_quota() == expected


# -- storage ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fs_type, device, rotational, expected", [
    ("nfs4", "server:/export", None, "network"),
    ("lustre", "10.0.0.1@tcp:/fs", None, "network"),
    ("virtiofs", "share", None, "network"),
    ("fuse.sshfs", "user@host:/data", None, "network"),
    ("fuse.gcsfuse", "bucket", None, "network"),
    ("fuse", "mountpoint-s3", None, "network"),
    ("fuse.lxcfs", "lxcfs", None, "unknown"),
    ("overlay", "overlay", None, "overlay"),
    ("fuse.fuse-overlayfs", "fuse-overlayfs", None, "overlay"),
    ("tmpfs", "tmpfs", None, "tmpfs"),
    ("ext4", "nvme0n1", False, "nvme"),
    ("xfs", "sda", True, "hdd"),
    ("xfs", "sda", False, "ssd"),
    ("ext4", "vda", True, "unknown"),  # virtio-blk's rotational flag says nothing about media
    ("ext4", "rbd0", False, "network"),
    ("ext4", None, None, "unknown"),
])
def test_storage_kind(fs_type, device, rotational, expected):
    assert storage_kind(fs_type, device, rotational) == expected


@pytest.mark.parametrize("kind, model, ephemeral", [
    ("nvme", "Amazon EC2 NVMe Instance Storage", True),
    ("nvme", "Amazon Elastic Block Store", None),
    ("nvme", "nvme_card", True),
    ("nvme", "nvme_card3", True),
    ("nvme", "nvme_card-pd", None),  # GCP persistent disk, not local SSD
    ("ssd", "EphemeralDisk", True),
    ("nvme", "Microsoft NVMe Direct Disk v2", True),
    ("overlay", None, True),
    ("tmpfs", None, True),
    ("ssd", "Samsung SSD 990 PRO 2TB", None),
])
def test_ephemeral_from(kind, model, ephemeral):
    flag, reason = ephemeral_from(kind, model)
    assert flag is ephemeral
    assert (reason is not None) == (ephemeral is True)


SYNTHETIC_MOUNTINFO = """\
27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
30 27 0:40 / /data rw,relatime shared:5 - nfs4 fs.example:/export rw,vers=4.1
31 27 0:41 / /data\\040set rw,relatime - xfs /dev/sdb1 rw
32 30 0:42 / /data/scratch rw - tmpfs tmpfs rw
33 30 0:43 / /data/scratch rw - overlay overlay rw
"""


def test_parse_mountinfo_and_mount_for():
    mounts = parse_mountinfo(SYNTHETIC_MOUNTINFO)
    assert mounts[0] == Mount("/", "ext4", "/dev/nvme0n1p2", "259:2")
    assert mounts[2].mount_point == "/data set"
    assert mount_for("/data/ckpt", mounts).fs_type == "nfs4"
    assert mount_for("/data set/x", mounts).fs_type == "xfs"
    assert mount_for("/database", mounts).fs_type == "ext4"  # /data is not a prefix of /database
    assert mount_for("/data/scratch/run1", mounts).fs_type == "overlay"  # the top of a stack
    assert mount_for("/", mounts).mount_point == "/"


# -- live, on this machine --------------------------------------------------------------------

def test_collect_host_live(tmp_path):
    host = collect_host(str(tmp_path), steal_window_s=0.05)
    assert host.cpu_logical_cores >= 1
    assert 1 <= host.cpu_usable_cores <= host.cpu_logical_cores
    assert host.memory_total_bytes > 0
    assert isinstance(host.somaxconn, int)
    assert host.workdir.path == str(tmp_path)
    assert host.workdir.fs_type
    assert isinstance(host.workdir.free_bytes, int) and host.workdir.free_bytes >= 0
    assert host.workdir.kind in {"nvme", "ssd", "hdd", "network", "overlay", "tmpfs", "unknown"}
    assert host.steal_window_s >= 0.05
    assert host.steal_pct is None or 0.0 <= host.steal_pct <= 100.0


def test_collect_host_explains_a_missing_workdir():
    host = collect_host("/nonexistent/dir", steal_window_s=0.0)
    assert host.workdir.path == "/nonexistent/dir"
    assert host.workdir.fs_type is None and host.workdir.free_bytes is None
    assert "does not exist" in host.unavailable["workdir"]


def test_one_failed_read_leaves_the_rest(monkeypatch, tmp_path):
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "product_name").write_text("Google Compute Engine\n")
    (dmi / "sys_vendor").write_text("Google\n")
    (dmi / "chassis_asset_tag").write_text("\n")
    monkeypatch.setattr(probe, "PROC_STAT", str(tmp_path / "no-stat"))
    monkeypatch.setattr(probe, "DMI_DIR", str(dmi))

    host = collect_host(str(tmp_path), steal_window_s=0.05)

    assert host.steal_pct is None and host.steal_since_boot_pct is None
    assert host.unavailable["steal_pct"].startswith(f"no {tmp_path / 'no-stat'}")
    assert host.dmi == {"product_name": "Google Compute Engine", "sys_vendor": "Google"}
    assert host.cloud == "gcp"
    assert host.memory_total_bytes > 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir("/dev/shm"),
                    reason="needs Linux /dev/shm")
def test_dev_shm_is_ram_backed_and_ephemeral():
    storage = probe.storage_for("/dev/shm")
    assert storage.kind == "tmpfs"
    assert storage.ephemeral is True


def test_storage_falls_back_to_psutil_mounts_without_mountinfo(monkeypatch, tmp_path):
    monkeypatch.setattr(probe, "PROC_MOUNTINFO", str(tmp_path / "no-mountinfo"))
    storage = probe.storage_for(str(tmp_path))
    assert storage.mount_point and storage.fs_type
    assert storage.free_bytes is not None


# -- spot / preemptible from the instance metadata (a fake metadata server on loopback) --------

import http.server  # noqa: E402
import threading  # noqa: E402

from gpuvet.probe.host import instance_lifecycle  # noqa: E402


@pytest.fixture
def metadata_server():
    """A local HTTP server answering like a cloud's metadata service: `routes` maps
    (method, path) to (status, body); every request is kept with its headers."""
    routes: dict[tuple[str, str], tuple[int, str]] = {}
    seen: list[tuple[str, str, dict[str, str]]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path, dict(self.headers)))
            status, body = routes.get((self.command, self.path), (404, "not found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_PUT = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", routes, seen
    server.shutdown()
    server.server_close()


def test_aws_spot_is_read_with_an_imdsv2_token(metadata_server):
    url, routes, seen = metadata_server
    routes[("PUT", "/latest/api/token")] = (200, "TOKEN-123")
    routes[("GET", "/latest/meta-data/instance-life-cycle")] = (200, "spot")
    found = instance_lifecycle("aws", base_url=url)
    assert found.preemptible is True and found.value == "spot"
    assert "instance-life-cycle" in found.source
    (put, _, put_headers), (get, _, get_headers) = seen
    assert (put, get) == ("PUT", "GET")
    assert {k.lower(): v for k, v in put_headers.items()}["x-aws-ec2-metadata-token-ttl-seconds"] == "60"
    assert {k.lower(): v for k, v in get_headers.items()}["x-aws-ec2-metadata-token"] == "TOKEN-123"


def test_aws_on_demand_and_a_refused_token_says_why(metadata_server):
    url, routes, _ = metadata_server
    routes[("PUT", "/latest/api/token")] = (200, "T")
    routes[("GET", "/latest/meta-data/instance-life-cycle")] = (200, "on-demand")
    assert instance_lifecycle("aws", base_url=url).preemptible is False
    routes[("PUT", "/latest/api/token")] = (403, "forbidden")
    refused = instance_lifecycle("aws", base_url=url)
    assert refused.preemptible is None and refused.error == "IMDSv2 token request failed: HTTP 403"


def test_gcp_spot_from_the_provisioning_model_or_the_older_preemptible_flag(metadata_server):
    url, routes, seen = metadata_server
    routes[("GET", "/computeMetadata/v1/instance/scheduling/provisioning-model")] = (200, "SPOT")
    spot = instance_lifecycle("gcp", base_url=url)
    assert spot.preemptible is True and spot.value == "SPOT"
    assert {k.lower(): v for k, v in seen[0][2].items()}["metadata-flavor"] == "Google"
    del routes[("GET", "/computeMetadata/v1/instance/scheduling/provisioning-model")]
    routes[("GET", "/computeMetadata/v1/instance/scheduling/preemptible")] = (200, "FALSE")
    older = instance_lifecycle("gcp", base_url=url)
    assert older.preemptible is False and older.source.endswith("scheduling/preemptible")


def test_azure_priority(metadata_server):
    url, routes, seen = metadata_server
    path = "/metadata/instance/compute/priority?api-version=2021-02-01&format=text"
    routes[("GET", path)] = (200, "Spot")
    assert instance_lifecycle("azure", base_url=url).preemptible is True
    routes[("GET", path)] = (200, "Regular")
    assert instance_lifecycle("azure", base_url=url).preemptible is False
    assert {k.lower(): v for k, v in seen[0][2].items()}["metadata"] == "true"


def test_no_metadata_service_answers_within_the_budget_and_says_why():
    import socket
    import time

    silent = socket.socket()  # accepts connections (the backlog) but never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        started = time.monotonic()
        found = instance_lifecycle("aws", base_url=f"http://127.0.0.1:{silent.getsockname()[1]}", budget_s=0.3)
        assert time.monotonic() - started < 1.0
        assert found.preemptible is None and "token request failed" in found.error
    finally:
        silent.close()
    assert instance_lifecycle("openstack") is None and instance_lifecycle(None) is None


def test_the_metadata_answer_lands_in_the_host_facts(monkeypatch):
    from gpuvet.facts import Host
    from gpuvet.probe import host as host_probe

    answers = {"aws": host_probe.Lifecycle(True, "spot", "EC2 instance metadata instance-life-cycle"),
               "gcp": host_probe.Lifecycle(None, None, "GCE metadata scheduling/provisioning-model", "HTTP 404")}
    monkeypatch.setattr(host_probe, "instance_lifecycle", lambda cloud: answers.get(cloud))
    spot, failed, other = Host(cloud="aws"), Host(cloud="gcp"), Host(cloud=None)
    for h in (spot, failed, other):
        host_probe._fill_lifecycle(h)
    assert (spot.preemptible, spot.lifecycle) == (True, "spot")
    assert failed.preemptible is None and failed.unavailable["lifecycle"].endswith("HTTP 404")
    assert other.preemptible is None and "lifecycle" not in other.unavailable
