"""The scale-out path without a server: request bodies, token/log-prob parsing, adapter sync calls."""
import asyncio

import pytest

from memagent.protocol import BackendError, GenerationRequest
from memagent.rl.remote import LoraReloadSync, TokenServerBackend


def fake_post(reply, log):
    async def post(path, body):
        log.append((path, body))
        return reply

    return post


VLLM_REPLY = {"prompt_token_ids": [1, 2, 3],
              "choices": [{"message": {"content": "k=a"}, "finish_reason": "length", "token_ids": [7, 8],
                           "logprobs": {"content": [{"token": "k", "logprob": -0.1}, {"token": "=", "logprob": -0.2}]}}]}


def test_token_server_backend_asks_for_and_parses_ids_and_logprobs():
    log = []
    be = TokenServerBackend(fake_post(VLLM_REPLY, log), model="policy-3")
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=1.0, seed=5,
                            return_tokens=True)
    gen = asyncio.run(be.generate(req))
    path, body = log[0]
    assert path == "/v1/chat/completions" and body["model"] == "policy-3" and body["seed"] == 5
    assert body["logprobs"] is True and body["return_token_ids"] is True and body["max_tokens"] == 2
    assert (gen.prompt_ids, gen.response_ids, gen.logprobs) == ([1, 2, 3], [7, 8], [-0.1, -0.2])
    assert gen.finish_reason == "length" and gen.text == "k=a"


def test_token_server_backend_refuses_a_server_without_ids():
    reply = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}
    be = TokenServerBackend(fake_post(reply, []), model="m")
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=2, return_tokens=True)
    with pytest.raises(BackendError, match="return_token_ids"):
        asyncio.run(be.generate(req))


def test_lora_reload_sync_loads_the_new_adapter_and_unloads_the_old(tmp_path):
    log, saved = [], []

    class Model:
        def save_pretrained(self, path):
            saved.append(path)

    sync = LoraReloadSync(fake_post({}, log), tmp_path)
    assert asyncio.run(sync.push(Model(), 1)) == "policy-1"
    assert asyncio.run(sync.push(Model(), 2)) == "policy-2"
    assert saved == [str(tmp_path / "policy-1"), str(tmp_path / "policy-2")]
    assert log == [("/v1/load_lora_adapter", {"lora_name": "policy-1", "lora_path": str(tmp_path / "policy-1")}),
                   ("/v1/load_lora_adapter", {"lora_name": "policy-2", "lora_path": str(tmp_path / "policy-2")}),
                   ("/v1/unload_lora_adapter", {"lora_name": "policy-1"})]
