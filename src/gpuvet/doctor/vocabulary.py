"""The words people use for each symptom, in Chinese and English: what `gpuvet doctor "..."` matches
a sentence against, word by word, not whole rows. The seeds' readers write "速度越跑越慢", "功耗墙",
"显卡温度90度", "实例被回收", "SSH断线", "xid 79", "power cap": each word here points at the
symptom it names. A longer word wins over a shorter one inside it ("利用率是100%" over "利用率",
"迭代速度变慢" over "变慢"), so a sentence is read by its most specific words."""

from __future__ import annotations

import re

# symptom name -> its words. ASCII words match whole words (case-insensitive, a word may continue:
# "throttl" matches "throttling"); other words match anywhere in the sentence.
WORDS: dict[str, tuple[str, ...]] = {
    "slow-from-start": ("偏慢", "跑分", "残血", "阉割", "限速", "功耗墙", "功耗限制", "限制功耗", "功耗上不去", "功耗低",
                        "频率上不去", "链路降级", "x8", "power cap", "power limit", "power wall", "capped", "tflops",
                        "benchmark", "slower than", "cut-down", "pcie", "吞吐量", "延迟波动", "p99", "功耗"),
    "slower-and-slower": ("越来越慢", "越跑越慢", "过一段时间", "降频", "温度", "过热", "散热", "发热", "90度", "85度", "90℃",
                          "throttl", "overheat", "temperature", "thermal", "over time", "after a while", "gets slower",
                          "degrad", "hot"),
    "gpu-low-cpu-high": ("利用率低", "利用率上不去", "利用率始终上不去", "上不了90%", "cpu很高", "cpu高", "数据管道", "喂不上",
                         "cpu核数", "num_workers", "prefetch", "dataloader", "data loader", "low util", "utilization low",
                         "low gpu util", "gpu idle", "cpu bound", "cpu high"),
    "multi-gpu-scaling": ("加速比", "多卡", "多机", "梯度同步", "allreduce", "all-reduce", "all_reduce", "nvlink", "scaling", "speedup",
                          "speed-up", "multi-gpu", "multi gpu", "multi-node"),
    "container-no-gpu": ("容器", "docker", "could not select device driver", "nvidia-container-toolkit", "is_available",
                         "cuda not available", "container", "找不到gpu", "看不到gpu", "无法识别cuda", "无法调用gpu"),
    "data-lost-after-restart": ("重启", "丢失", "回收", "被回收", "抢占", "数据没了", "spot", "preempt", "reclaim",
                                "data lost", "checkpoint lost", "ephemeral", "reboot"),
    "day-night": ("白天", "夜", "高峰", "时段", "晚上", "卡成ppt", "peak hour", "daytime", "night", "time of day", "by day"),
    "cuda-init-slow": ("卡住", "30秒", "初始化", "to(cuda)", "to('cuda')", ".cuda()", "context init", "cuda init",
                       "first cuda call", "hang", "上下文", "device_count"),
    "no-kernel-image": ("no kernel image", "kernel image", "compute capability", "sm_", "unsupported gpu architecture",
                        "ptx"),
    "nccl-hang": ("nccl", "ncclcomminitrank", "init_process_group", "version mismatch", "卡死"),
    "memory-mismatch": ("显存占满", "显存不一致", "显存", "memory_allocated", "memory_reserved", "oom", "out of memory"),
    "busy-but-slow": ("利用率是100%", "利用率100%", "利用率可能是100%", "100%", "分时", "时间片", "迭代速度变慢", "迭代变慢",
                      "邻居", "time-slic", "time slic", "busy but slow", "100% busy"),
    "gpu-errors": ("xid", "sxid", "ecc", "ecc错误", "掉卡", "计算错误", "fallen off", "reset required", "row remap",
                   "uncorrectable", "gpu error"),
    "ssh-drops": ("ssh", "断线", "断开", "掉线", "broken pipe", "disconnect", "keepalive", "keep-alive", "connection reset"),
    "jupyter-slow": ("jupyter", "jupyterlab", "notebook", "iopub", "cell", "nbresuse"),
}


def matches(sentence: str) -> dict[str, list[str]]:
    """symptom name -> the words of the sentence that name it, the longest word taking its place."""
    text = sentence.lower()
    found: list[tuple[int, int, str, str]] = []  # start, end, word, symptom
    for name, words in WORDS.items():
        for word in words:
            pattern = rf"(?<![a-z0-9_]){re.escape(word)}" if word.isascii() else re.escape(word)
            found += [(m.start(), m.end(), word, name) for m in re.finditer(pattern, text)]
    taken: list[tuple[int, int]] = []
    chosen: dict[str, list[str]] = {}
    for start, end, word, name in sorted(found, key=lambda f: (f[0] - f[1], f[0])):  # longest first
        if any(start < t_end and t_start < end for t_start, t_end in taken if (t_start, t_end) != (start, end)):
            continue
        taken.append((start, end))
        chosen.setdefault(name, []).append(word)
    return chosen


def known_symptoms(names: list[tuple[str, str]]) -> str:
    """The list a user reads when nothing matched: "slow-from-start (Slower than ...); ..." """
    return "; ".join(f"{name} ({description})" for name, description in names)
