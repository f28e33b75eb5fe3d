"""gpuvet doctor in the readers' language: every symptom sentence of the two seed documents, and the
words the issue found answered with nothing, point at the symptom they describe."""

from __future__ import annotations

import pytest

from gpuvet.doctor import SYMPTOMS, find_symptom
from gpuvet.doctor.diagnose import known_symptoms
from tests.cli_runner import gpuvet

# The seeds' own sentences (quoted from /work/shared/seeds: 000 the first document, 001 the second).
SEED_SENTENCES = [
    ("同样型号显卡，跑分和速度明显偏慢", "slow-from-start"),
    ("训练一开始正常，过一段时间越来越慢", "slower-and-slower"),
    ("GPU利用率始终上不去，但CPU很高", "gpu-low-cpu-high"),
    ("多卡训练加速比远低于理论值", "multi-gpu-scaling"),
    ("容器内无法调用GPU，报错“could not select device driver”", "container-no-gpu"),
    ("实例重启后环境或数据丢失", "data-lost-after-restart"),
    ("夜深人静时跑得飞快，白天卡成PPT", "day-night"),
    ("A节点平均功耗能冲到420W，B节点始终卡在320W左右，最后B节点的训练时间整整慢了15%", "slow-from-start"),
    ("如果是P0但持续高负载频率上不去，十有八九是功耗墙限制", "slow-from-start"),
    ("GPU在长时间高负载下温度冲到85℃甚至90℃", "slower-and-slower"),
    ("所以要是发现某台机器跑大任务时速度越跑越慢，先看一眼温度曲线", "slower-and-slower"),
    ("你这边就会明显感觉到迭代速度变慢，但你的nvidia-smi里看到的算力利用率可能是100%", "busy-but-slow"),
    ("一台配了8核CPU的4090实例，跑图像分类任务时GPU利用率始终上不了90%", "gpu-low-cpu-high"),
    ("结果实例被回收后一切归零，重新来过不说，时间成本直接翻倍", "data-lost-after-restart"),
    ("游戏卡转训练卡的那些平台，往往默认关闭ECC以追求极限跑分，长期跑大数据集时出现计算错误的风险", "gpu-errors"),
    ("跑ResNet50训练时吞吐量只有本地RTX 4090的60%", "slow-from-start"),
    ("model.to(cuda)之后卡住30秒才响应", "cuda-init-slow"),
    ("他们抱怨推理延迟波动极大P99延迟从80ms跳到1200ms", "slow-from-start"),
    ("nccl报错NCCL version mismatch或者torch.distributed.init_process_group卡死在ncclCommInitRank", "nccl-hang"),
    ("torch.acceleratorerror: cuda error: no kernel image is available for execution", "no-kernel-image"),
    ("torch.cuda.memory_allocated()返回的值可能比实际物理占用高3倍", "memory-mismatch"),
    ("nvidia-smi却显示显存占满触发OOM Killer杀掉进程", "memory-mismatch"),
    ("通过JupyterLab notebook执行相同cell耗时4.3s", "jupyter-slow"),
    ("导致torch.cuda.is_available()始终返回False", "container-no-gpu"),
    ("vscode连接ssh远程服务器后内置的Python解释器无法识别CUDA", "container-no-gpu"),
    ("gloo后端频繁发送1KB的梯度同步包，直接导致AllReduce延迟飙升", "multi-gpu-scaling"),
    ("每次import torch后首次torch.cuda.device_count()都要触发完整的GPU上下文重建耗时近1秒", "cuda-init-slow"),
]

# What the issue typed that found nothing (exit 2), or the opposite symptom.
READERS_WORDS = [
    ("速度越跑越慢", "slower-and-slower"), ("降频", "slower-and-slower"), ("功耗墙", "slow-from-start"),
    ("显卡温度90度", "slower-and-slower"), ("实例被回收", "data-lost-after-restart"), ("ECC错误", "gpu-errors"),
    ("SSH断线", "ssh-drops"), ("jupyter很慢", "jupyter-slow"), ("xid 79", "gpu-errors"), ("throttling", "slower-and-slower"),
    ("power cap", "slow-from-start"), ("spot instance reclaimed", "data-lost-after-restart"),
    ("利用率是100%但是迭代速度变慢", "busy-but-slow"),
]


@pytest.mark.parametrize(("sentence", "name"), SEED_SENTENCES + READERS_WORDS)
def test_the_readers_sentences_find_their_symptom(sentence, name):
    found = find_symptom(sentence)
    assert found is not None and found.name == name, (sentence, found and found.name)


def test_doctor_answers_the_readers_words_on_the_command_line(capsys, tmp_path):
    db = str(tmp_path / "empty.db")  # no stored run: the causes and how to check each
    for words, name in READERS_WORDS:
        code, out, err = gpuvet(capsys, "doctor", words, "--json", "--db", db)
        assert code == 0 and f'"symptom": "{name}"' in out, (words, err)


def test_when_nothing_matches_the_known_symptoms_are_listed():
    listed = known_symptoms()
    assert all(s.name in listed for s in SYMPTOMS) and find_symptom("xyzzy plugh") is None
