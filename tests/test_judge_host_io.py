"""storage.* and net.* rules on measurements. Figures marked "synthetic" are made up for the rule
under test, shaped exactly like the benchmark's output; the rest come from this machine."""

from __future__ import annotations

import pytest

from gpuvet.bench import disk, net
from gpuvet.facts import Gpu, Host, Machine, Nic, RdmaPort, Storage
from gpuvet.judge import host_io
from gpuvet.judge.common import Context
from gpuvet.probe.host import collect_host
from gpuvet.probe.network import collect_nics, collect_rdma
from gpuvet.record import Measurement

PATH = "/data"


def synthetic_disk(kind: str, write: float, read: float, iops: float, files: float, path: str = PATH,
                   model: str | None = None) -> list[Measurement]:
    """The four disk figures for one path, as disk.run reports them (synthetic values)."""
    common = {"engine": "fio", "cache": "O_DIRECT", "fs_type": "nfs4" if kind == "network" else "ext4", "kind": kind,
              "mount_point": "/", "bytes": 2**30, "runtime_s": 1.0, "model": model}
    return [
        Measurement("disk.seq_write", write, "MB/s", path, {**common, "block_size": 2**20, "queue_depth": 8}),
        Measurement("disk.seq_read", read, "MB/s", path, {**common, "block_size": 2**20, "queue_depth": 8}),
        Measurement("disk.rand_read_iops", iops, "IOPS", path,
                    {**common, "block_size": 4096, "queue_depth": 32, "p50_us": 100.0, "p99_us": 400.0}),
        Measurement("disk.small_files", files, "files/s", path,
                    {**common, "engine": "builtin", "cache": "fsync+fadvise", "files": 4096, "file_bytes": 16384, "readers": 4,
                     "read_mb_s": round(files * 16384 / 1e6, 1), "write_files_s": 5000.0}),
    ]


def storage(measurements: list[Measurement], gpus: int = 1, **options) -> dict[str, object]:
    machine = Machine(gpus=[Gpu(index=i) for i in range(gpus)], host=Host(memory_total_bytes=16 * 2**30))
    ctx = Context(machine, measurements, {"benchmarks": ["disk"], **options})
    return {f.check: f for f in host_io.check_storage(ctx)}


def test_a_healthy_nvme_passes_with_epoch_time():
    found = storage(synthetic_disk("nvme", write=2800, read=3400, iops=420_000, files=9000))
    assert {f.status for f in found.values()} == {"pass"}
    assert "takes 15 s per epoch" in found["storage.read"].summary  # 50 GB at 3,400 MB/s


def test_the_summary_names_the_engine_and_the_latency_percentiles():
    found = storage(synthetic_disk("unknown", write=800, read=900, iops=37_348, files=9000))
    assert found["storage.random_read"].summary.startswith(
        "random 4 KiB reads 37,348 IOPS, p50 100 us, p99 400 us (fio; virtual or unknown disk, ext4)")
    assert found["storage.read"].summary.startswith("sequential read 900 MB/s (fio; virtual or unknown disk, ext4)")
    assert "(builtin; " in found["storage.small_files"].summary


def test_nvme_at_sata_speed_fails_against_its_device_type():
    f = storage(synthetic_disk("nvme", write=250, read=420, iops=8000, files=9000))["storage.read"]
    assert f.status == "fail" and "far below any healthy NVMe" in f.summary
    assert "2-7 GB/s" in f.evidence.expected and "datasheets" in f.evidence.source
    assert "lsblk" in f.remedy


def test_an_ebs_volume_posing_as_nvme_is_named():
    found = storage(synthetic_disk("nvme", write=125, read=125, iops=3000, files=900, model="Amazon Elastic Block Store"))
    assert found["storage.read"].status == "fail"
    assert "network block volume" in found["storage.read"].summary


def test_sata_ssd_is_fine_as_a_device_but_short_for_four_gpus():
    found = storage(synthetic_disk("ssd", write=480, read=530, iops=85_000, files=6000), gpus=4)
    read = found["storage.read"]
    assert read.status == "warn" and "below a healthy" not in read.summary
    assert ">= 1,200 MB/s" in read.evidence.expected and "ResNet-50" in read.evidence.source
    assert found["storage.write"].status == "pass" and found["storage.random_read"].status == "pass"


def test_hdd_random_reads_cannot_feed_a_gpu():
    found = storage(synthetic_disk("hdd", write=170, read=180, iops=160, files=140))
    assert found["storage.write"].status == "pass"  # a healthy HDD, and a checkpoint in a minute
    assert found["storage.read"].status == "warn"  # 180 MB/s < 300 MB/s the GPU eats
    rand = found["storage.random_read"]
    assert rand.status == "warn" and "100-200 reads/s" in rand.evidence.expected


def test_hdd_far_below_its_kind_fails():
    assert storage(synthetic_disk("hdd", write=20, read=25, iops=20, files=50))["storage.random_read"].status == "fail"


def test_network_file_system_small_files_warn_with_a_dataset_epoch_time():
    found = storage(synthetic_disk("network", write=300, read=900, iops=4000, files=400), dataset_gb=120)
    small = found["storage.small_files"]
    assert small.status == "warn" and "network file system" in small.summary and "round trip" in small.summary
    assert "120 GB dataset" in small.summary and "h per epoch" in small.summary  # 120 GB at 6.6 MB/s
    assert "WebDataset" in small.remedy
    assert found["storage.read"].status == "pass"  # no device yardstick for NFS; 900 MB/s feeds one GPU


def test_small_files_without_mb_s_say_what_is_missing_instead_of_a_question_mark():
    measurements = synthetic_disk("network", write=300, read=900, iops=4000, files=400)
    small = measurements[-1]
    del small.details["read_mb_s"]  # synthetic: an older record without the MB/s figure
    assert "h per epoch" in storage(measurements, dataset_gb=120)["storage.small_files"].summary  # from files/s x 16 KiB
    del small.details["file_bytes"]
    summary = storage(measurements, dataset_gb=120)["storage.small_files"].summary
    assert "?" not in summary and "no epoch time: the benchmark reported neither MB/s nor the file size" in summary


def test_slow_checkpoint_writes_warn():
    f = storage(synthetic_disk("unknown", write=40, read=800, iops=20000, files=5000), checkpoint_gb=20)["storage.write"]
    assert f.status == "warn" and "20 GB checkpoint takes 8 min" in f.summary


def test_a_checkpoint_is_predicted_from_the_slower_of_direct_and_buffered_plus_fsync():
    # The figures on one directory: 1,740 MB/s with O_DIRECT, 93 MB/s as torch.save + fsync writes.
    measurements = synthetic_disk("nvme", write=1740, read=3000, iops=200_000, files=20_000)
    measurements[0].details["checkpoint_mb_s"] = 93.0
    f = storage(measurements, checkpoint_gb=10)["storage.write"]
    assert f.status == "warn" and "10 GB checkpoint takes 108 s" in f.summary  # 5.7 s by the direct figure
    assert "93 MB/s" in f.summary and "1,740 MB/s with O_DIRECT" in f.summary


def test_a_tmpfs_path_is_not_shared_storage_tested():
    measurements = synthetic_disk("tmpfs", write=4000, read=9000, iops=900_000, files=90_000, path="/dev/shm")
    for m in measurements:
        m.details.update(fs_type="tmpfs", mount_point="/dev/shm")
    machine = Machine(gpus=[Gpu(index=0)], host=Host(memory_total_bytes=16 * 2**30, workdir=Storage(path="/tmp", mount_point="/")))
    (f,) = host_io.check_shared_storage(Context(machine, measurements, {"benchmarks": ["disk"], "paths": ["/dev/shm"]}))
    assert f.status == "skip" and "no shared or network storage tested" in f.summary


def test_this_machines_checkpoint_write_is_timed_through_the_page_cache(tmp_path):
    target = disk.Target(str(tmp_path), str(tmp_path), str(tmp_path / "seq.bin"), 64 * 2**20, 0, False, Storage())
    result = disk.checkpoint_write(target, 2.0)
    assert result is not None and result.bytes > 0 and result.mb_s > 0 and "fsync_s" in result.extra


def test_tmpfs_is_ram_not_a_disk():
    found = storage(synthetic_disk("tmpfs", write=4000, read=9000, iops=900_000, files=90_000))
    assert all(f.status == "measured" and "RAM, not a disk" in f.summary for f in found.values())


def test_a_path_that_could_not_be_tested_is_skipped_with_the_reason_never_failed():
    notes = [Measurement(**disk.note("/mnt/ro", "skipped", "read-only file system: /mnt/ro")),
             Measurement(**disk.note("/mnt/nfs", "failed", "fio did not finish within 45 s"))]
    findings = host_io.check_storage(Context(Machine(), notes, {"benchmarks": ["disk"]}))
    assert len(findings) == 8 and {f.status for f in findings} == {"skip"}
    assert "read-only" in findings[0].summary and "could not run: fio did not finish" in findings[4].summary


def test_storage_rules_only_when_disk_was_planned():
    assert host_io.check_storage(Context(Machine(), synthetic_disk("nvme", 1, 1, 1, 1), {"benchmarks": ["gemm"]})) == []
    (f,) = host_io.check_storage(Context(Machine(), [], {"benchmarks": ["disk"]}))
    assert f.status == "skip"


def test_this_machines_disk_figures_are_judged(tmp_path):
    results = disk.run([str(tmp_path)], engine="builtin", budget_s=2.0, max_bytes=64 * disk.MIB)
    found = storage([Measurement(**m) for m in results])
    assert set(found) == {"storage.write", "storage.read", "storage.random_read", "storage.small_files"}
    assert all(f.status in ("pass", "warn", "fail") and f.evidence.measured for f in found.values())


# -- network ----------------------------------------------------------------------------------

def network(measurements: list[Measurement] = (), nics=None, rdma=None, gpus: int = 1, **options) -> dict[tuple, object]:
    machine = Machine(gpus=[Gpu(index=i) for i in range(gpus)], host=Host(nics=nics, rdma=rdma))
    ctx = Context(machine, list(measurements), {"benchmarks": ["net"], **options})
    return {(f.check, f.subject): f for f in host_io.check_network(ctx)}


def synthetic_loopback(latency_us: float, gbit: float) -> list[Measurement]:
    return [Measurement("net.loopback_latency", latency_us, "us", "loopback",
                        {"engine": "builtin", "p99_us": latency_us * 3, "round_trips": 20000}),
            Measurement("net.loopback_throughput", gbit, "Gbit/s", "loopback", {"engine": "iperf3"})]


def test_loopback_at_the_seeds_healthy_figure_passes_with_what_was_expected_and_why():
    f = network(synthetic_loopback(28, 25))[("net.loopback", "loopback")]
    assert f.status == "pass" and "28 us = 0.028 ms" in f.summary  # on the scale of the seed's ping, in ms
    assert f.evidence.expected == ("round trip under 120 us (0.12 ms; the seed's ping: 0.02 ms healthy, 0.15 ms filtered, "
                                   "0.38 ms overlay), one stream over 2 Gbit/s")
    assert "ping -c 100 localhost" in f.evidence.source and "0.02 ms" in f.evidence.source and "0.38 ms" in f.evidence.source


@pytest.mark.parametrize("latency", [150, 380])  # the seed: security-group filtering, overlay network
def test_loopback_in_the_seeds_bad_band_warns(latency):
    f = network(synthetic_loopback(latency, 25))[("net.loopback", "loopback")]
    assert f.status == "warn" and "0.15 ms" in f.evidence.source and "iptables" in f.remedy


def test_this_machines_loopback_is_judged():
    results = [Measurement(**m) for m in net.run_loopback(engine="builtin", budget_s=1.0)]
    f = network(results, nics=collect_nics(), rdma=collect_rdma())[("net.loopback", "loopback")]
    assert f.status in ("pass", "warn") and "TCP round trip" in f.summary


TEN_GBE = [Nic("ens5", 10000, "up", 9001, "ena"), Nic("lo", None, "unknown", 65536, None, True)]
NDR = [RdmaPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"), RdmaPort("mlx5_1", 1, "DOWN", "Disabled", None, "InfiniBand")]


def test_ten_gbe_without_rdma_warns_only_for_multi_node():
    assert network(nics=TEN_GBE, rdma=[], gpus=8, multi_node=True)[("net.nics", "host")].status == "warn"
    single = network(nics=TEN_GBE, rdma=[], gpus=8)[("net.nics", "host")]
    assert single.status == "measured" and "ens5 (ena, up, 10 Gbit/s)" in single.summary


def test_a_nic_of_unknown_speed_is_measured_not_passed_for_multi_node():
    # A cloud VM's virtio NIC reports no link speed: nothing says it is fast enough.
    f = network(nics=[Nic("eth0", None, "up", 1500, "virtio_net")], rdma=[], gpus=8, multi_node=True)[("net.nics", "host")]
    assert f.status == "measured" and "not judged for multi-node training until measured" in f.summary
    assert "gpuvet net test" in f.remedy


def test_no_rdma_is_a_note_unless_multi_node():
    multi = network(nics=TEN_GBE, rdma=[], gpus=8, multi_node=True)[("net.rdma", "host")]
    assert multi.status == "warn" and "TCP sockets" in multi.summary and "NCCL_DEBUG" in multi.remedy
    single = network(nics=TEN_GBE, rdma=[], gpus=8)[("net.rdma", "host")]
    assert single.status == "skip" and "multi-GPU machine" in single.summary


def test_active_infiniband_passes_with_its_rate():
    found = network(nics=TEN_GBE, rdma=NDR, gpus=8, multi_node=True)
    rdma = found[("net.rdma", "host")]
    assert rdma.status == "pass" and "1 of 2" in rdma.summary and "400 Gb/s InfiniBand" in rdma.summary
    assert found[("net.nics", "host")].status == "pass"  # RDMA carries the gradients, not the 10 GbE


def test_facts_not_read_give_no_finding():
    assert set(network(nics=None, rdma=None)) == {("net.loopback", "loopback")}  # planned, so it says why it is missing
    assert host_io.check_network(Context(Machine(host=None), [], {})) == []  # a capture: no host facts


def synthetic_peer(gbit: float, latency_us: float, interface: str | None = None) -> list[Measurement]:
    route = {"interface": interface, "source_address": "10.0.0.4", "peer_address": "10.0.0.9"} if interface else {}
    return [Measurement("net.tcp_throughput", gbit, "Gbit/s", "net:node2", {"engine": "iperf3", "streams": 4, **route}),
            Measurement("net.tcp_latency", latency_us, "us", "net:node2",
                        {"engine": "builtin", "p99_us": latency_us * 2, **route})]


def test_node_to_node_far_below_the_link_warns():
    nics = [Nic("ens1f0", 100000, "up", 9000, "mlx5_core")]
    f = network(synthetic_peer(9.4, 80, "ens1f0"), nics=nics, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "warn" and "9% of the 100 Gbit/s link of ens1f0" in f.summary
    assert "through ens1f0 from 10.0.0.4 (100 Gbit/s link)" in f.summary
    assert ">= 50% of ens1f0's 100 Gbit/s link (50 Gbit/s)" in f.evidence.expected
    assert "iperf3 -P 4" in f.evidence.source and "re:Invent" in f.evidence.source


def test_node_to_node_is_judged_against_the_link_the_route_takes_not_the_fastest():
    """A 10 GbE management port carries the route; the idle 100 GbE port is not the yardstick."""
    nics = [Nic("ens1f0", 100000, "up", 9000, "mlx5_core"), Nic("eno1", 10000, "up", 1500, "ixgbe")]
    f = network(synthetic_peer(9.4, 80, "eno1"), nics=nics, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "pass" and "through eno1 from 10.0.0.4 (10 Gbit/s link)" in f.summary
    assert "eno1's 10 Gbit/s link" in f.evidence.expected


def test_node_to_node_through_a_virtual_nic_has_no_link_yardstick_and_says_so():
    nics = [Nic("eth0", None, "up", 1500, "virtio_net")]
    f = network(synthetic_peer(4.8, 120, "eth0"), nics=nics, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "pass" and "no link speed reported: a virtual NIC" in f.summary
    assert "link" not in f.evidence.expected and "round trip under 500 us" in f.evidence.expected


def test_an_older_record_without_the_route_falls_back_to_the_fastest_link():
    nics = [Nic("ens1f0", 100000, "up", 9000, "mlx5_core")]
    f = network(synthetic_peer(9.4, 80), nics=nics, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "warn" and "route not recorded" in f.summary and "9% of the 100 Gbit/s link of ens1f0" in f.summary


def test_node_to_node_near_line_rate_passes_and_high_latency_warns():
    nics = [Nic("ens5", 25000, "up", 9001, "ena")]
    assert network(synthetic_peer(23.5, 90, "ens5"), nics=nics, rdma=[])[("net.node_to_node", "net:node2")].status == "pass"
    far = network(synthetic_peer(23.5, 900, "ens5"), nics=nics, rdma=[])[("net.node_to_node", "net:node2")]
    assert far.status == "warn" and "another zone" in far.summary


def test_a_throughput_the_engine_skipped_is_named_next_to_the_latency():
    found = [synthetic_peer(9.4, 80)[1],
             Measurement(**net.note("net:node2", "skipped", "the server at node2 runs without iperf3 (started with "
                                                            "--engine builtin, or iperf3 missing there)"))]
    f = network(found, nics=TEN_GBE, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "pass" and "throughput not measured: the server at node2 runs without iperf3" in f.summary


def test_a_failed_node_test_is_reported_as_a_skip_with_the_reason():
    note = Measurement(**net.note("net:node2", "failed", "no gpuvet server answered at node2:5202"))
    f = network([note], nics=TEN_GBE, rdma=[])[("net.node_to_node", "net:node2")]
    assert f.status == "skip" and "gpuvet server" in f.summary


def test_this_machines_network_facts_are_judged():
    host = collect_host(steal_window_s=0.01)
    host.nics, host.rdma = collect_nics(), collect_rdma()
    found = host_io.check_network(Context(Machine(host=host), [], {}))
    assert {f.check for f in found} == {"net.nics", "net.rdma"}  # net was not planned: no loopback check
    assert all(f.status in ("pass", "skip", "measured") for f in found)
