"""Remote rollouts end to end: the trainer samples from two real `memagent serve --backend embedded`
processes through vLLM's request fields (return_token_ids, logprobs) and LoRA load/unload calls.

The tiny character model from memagent/rl/tiny.py is saved to a folder; both servers serve it and the
trainer loads it with a LoRA adapter. Checked: the servers' sampling log-probs equal the trainer's
recomputation of the same tokens (max difference printed and bounded), each step's adapter is loaded on
every live replica and the previous one unloaded, rollouts use both replicas, and a replica killed
between the steps is survived (step 2 runs on the other) and taken back once it answers a sync again.
"""
import asyncio
import json
import urllib.error
import urllib.request

import pytest
import torch

from servers import servers  # noqa: F401  (fixture)


def get(server, path):
    with urllib.request.urlopen(server.root_url + path, timeout=5) as r:
        return json.loads(r.read())


def post(server, path, body):
    req = urllib.request.Request(server.root_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


@pytest.fixture
def tiny_folder(tmp_path):
    from memagent.rl.tiny import build_model, build_tokenizer

    folder = tmp_path / "tiny"
    build_tokenizer(folder)
    build_model(seed=0).save_pretrained(str(folder))
    return folder


def serve(servers, folder, **kw):
    return servers("--backend", "embedded", "--model", str(folder), "--served-model-name", "tiny",
                   "--threads", "1", "--max-batch", "16", ready_timeout=120, **kw)


def check_vllm_token_fields(s):
    """The fields vLLM answers: prompt_token_ids, choices[0].token_ids, choices[0].logprobs.content."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "ab|-|kx>"}], "max_tokens": 4,
            "temperature": 1.0, "seed": 3, "return_token_ids": True, "logprobs": True}
    out = json.loads(post(s, "/v1/chat/completions", body))
    choice = out["choices"][0]
    assert out["prompt_token_ids"] and len(choice["token_ids"]) == len(choice["logprobs"]["content"]) >= 1
    assert all(t["logprob"] <= 0 and isinstance(t["token"], str) for t in choice["logprobs"]["content"])
    again = json.loads(post(s, "/v1/chat/completions", body))  # seeded: the same draw
    assert again["choices"][0]["token_ids"] == choice["token_ids"]
    plain = json.loads(post(s, "/v1/chat/completions", {k: v for k, v in body.items()
                                                         if k not in ("return_token_ids", "logprobs")}))
    assert "prompt_token_ids" not in plain and plain["choices"][0]["logprobs"] is None
    with pytest.raises(urllib.error.HTTPError) as e:  # unknown adapter name
        post(s, "/v1/unload_lora_adapter", {"lora_name": "nope"})
    assert e.value.code == 404


def test_two_steps_with_rollouts_on_two_server_replicas(servers, tiny_folder, tmp_path, capsys):
    from memagent.rl.advantage import Row
    from memagent.rl.config import TrainConfig
    from memagent.rl.data import CharKVTask
    from memagent.rl.engine import Trainer
    from memagent.rl.policy import micro_batches, token_logprobs
    from memagent.rl.tiny import TINY_TEMPLATE

    torch.set_num_threads(1)
    a, b = serve(servers, tiny_folder), serve(servers, tiny_folder)
    check_vllm_token_fields(a)
    cfg = TrainConfig(model=str(tiny_folder), use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"],
                      backend="openai", backend_url=f"{a.root_url},{b.root_url}", beta=0.0, memory_tokens=3,
                      answer_tokens=2, questions_per_step=4, num_generations=4, dynamic_sampling=False,
                      learning_rate=1e-2, warmup_steps=0, max_steps=2, mask_truncated_completions=False,
                      output_dir=str(tmp_path / "run"), progress=False, device="cpu", torch_threads=1)
    tr = Trainer(cfg, task=CharKVTask(num_chunks=2), template=TINY_TEMPLATE)
    diffs, served = [], []
    update = tr.update

    def checked_update(trajs):
        """Before the update: the trainer's log-probs of exactly the tokens the servers sampled."""
        convs = [cv for t in trajs for cv in t.conversations if cv.response_ids]
        rows = [Row(cv.prompt_ids, cv.response_ids, cv.logprobs, 0.0, 0, cv.kind, cv.finished) for cv in convs]
        served.append(len(rows))
        worst = 0.0
        with torch.no_grad():
            for mb in micro_batches(rows, 4096, tr.pad_id, tr.device):
                logp, _ = token_logprobs(tr.model, mb, cfg.temperature)
                for i, r in enumerate(mb.rows):
                    n = len(r.response_ids)
                    mine = logp[i, logp.shape[1] - n:]
                    worst = max(worst, float((mine - torch.tensor(r.sampler_logprobs)).abs().max()))
        diffs.append(worst)
        return update(trajs)

    tr.update = checked_update
    rec1 = tr.train_step()
    la, lb = get(a, "/v1/lora_adapters"), get(b, "/v1/lora_adapters")
    assert [x["name"] for x in la["adapters"]] == [x["name"] for x in lb["adapters"]] == ["policy-0"]
    assert a.health()["completed"] > 0 and b.health()["completed"] > 0  # both replicas did rollouts
    b.stop()  # SIGKILL between the steps
    before_a = a.health()["completed"]
    rec2 = tr.train_step()
    la = get(a, "/v1/lora_adapters")
    assert [x["name"] for x in la["adapters"]] == ["policy-1"] and la["loads"] == 2 and la["unloads"] == 1
    assert a.health()["completed"] > before_a  # step 2 ran on the surviving replica
    assert tr.backend.replicas[1].healthy is False
    assert rec1["step"] == 1 and rec2["step"] == 2 and rec1["trajectories"] == rec2["trajectories"] == 16
    assert all(d < 1e-4 for d in diffs), diffs
    assert rec1["logprob_mismatch"] is not None and rec1["logprob_mismatch"] < 1e-4
    # the killed replica restarts on its port; the next sync gives it the current adapter and takes it back
    b2 = serve(servers, tiny_folder, port=b.port)
    name = asyncio.run(tr.sync.push(tr.model, tr.step))
    assert [x["name"] for x in get(b2, "/v1/lora_adapters")["adapters"]] == [name]
    assert tr.backend.replicas[1].healthy is True
    asyncio.run(tr.aclose())
    with capsys.disabled():
        print(f"\nremote rollouts: max |server - trainer| log-prob per step: {diffs} "
              f"({served} sampled turns); logprob_mismatch means {rec1['logprob_mismatch']:.2e}, "
              f"{rec2['logprob_mismatch']:.2e}")
