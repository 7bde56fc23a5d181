"""HAMburger in PyTorch, for training: a Llama base (frozen, or its first
layers tuned, optionally with low-rank adapters on the others), the
compositional embedder (merger), the micro-step decoder and the stop head,
with the semantics of `docs/model.md` and the original key
names.

The runtime (Rust, ggml) is what users run; this module exists so that the
grafted modules can be trained with autograd. `greedy` decodes exactly as the
runtime does, so an export can be checked token for token against it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .copying import copy_matrix, embed_candidates


@dataclass
class Config:
    """The base's shapes (from `config.json`) and the grafted modules' (from `hamburger.json`)."""

    vocab: int
    dim: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    eps: float
    rope_theta: float
    rope_scaling: dict | None
    feature_layers: list[int]
    micro_layers: int
    merger_heads: int
    max_steps: int
    eos: list[int]

    @staticmethod
    def load(ckpt: Path) -> "Config":
        """Reads `config.json` and `hamburger.json` of a checkpoint directory."""
        c = json.loads((ckpt / "config.json").read_text())
        h = json.loads((ckpt / "hamburger.json").read_text())
        eos = c.get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos]
        n_head = c["num_attention_heads"]
        return Config(
            vocab=c["vocab_size"], dim=c["hidden_size"], n_layer=c["num_hidden_layers"], n_head=n_head,
            n_head_kv=c.get("num_key_value_heads", n_head), head_dim=c.get("head_dim") or c["hidden_size"] // n_head,
            ffn=c["intermediate_size"], eps=c["rms_norm_eps"], rope_theta=c.get("rope_theta", 10000.0),
            rope_scaling=c.get("rope_scaling"), feature_layers=list(h["feature_layers"]),
            micro_layers=h["micro_layers"], merger_heads=h["merger_heads"], max_steps=h["max_steps"],
            eos=[e for e in eos if e is not None],
        )


def rope_inv_freq(cfg: Config) -> torch.Tensor:
    """Rotary inverse frequencies, with Llama 3's frequency scaling when configured."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    s = cfg.rope_scaling
    if s and s.get("rope_type", s.get("type")) == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(is_mid, mid, scaled)
    return inv.float()


def rope(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding of x [..., T, heads, head_dim] at positions pos [..., T]."""
    ang = pos[..., None].float() * inv  # [..., T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in f32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""A Llama layer's linear projections (the ones a low-rank adapter can wrap)."""

# Where a projection sits in the original key layout, for its adapter's keys.
PROJECTION_PREFIX = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                     "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


class Layer(nn.Module):
    """One Llama decoder layer (HF layout: rotate-half q/k rows)."""

    def __init__(self, cfg: Config):
        super().__init__()
        d, hd = cfg.dim, cfg.head_dim
        self.cfg = cfg
        self.input_layernorm = nn.Parameter(torch.ones(d))
        self.post_attention_layernorm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, cfg.n_head * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.n_head_kv * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.n_head_kv * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * hd, d, bias=False)
        self.gate_proj = nn.Linear(d, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(d, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, d, bias=False)
        self.adapters = nn.ParameterDict()

    def add_adapters(self, rank: int) -> None:
        """Low-rank adapters on every projection: `proj(h) + (h A^T) B^T`, A
        [rank, in] small random, B [out, rank] zero, so the layer starts
        unchanged; `merge_adapters` folds them into the weights."""
        for name in PROJECTIONS:
            w = getattr(self, name).weight
            self.adapters[f"{name}_A"] = nn.Parameter(torch.randn(rank, w.shape[1]) / math.sqrt(w.shape[1]))
            self.adapters[f"{name}_B"] = nn.Parameter(torch.zeros(w.shape[0], rank))

    def merge_adapters(self) -> None:
        """W += B A for every adapted projection; the adapters are dropped."""
        with torch.no_grad():
            for name in PROJECTIONS:
                if f"{name}_A" in self.adapters:
                    getattr(self, name).weight += self.adapters[f"{name}_B"] @ self.adapters[f"{name}_A"]
        self.adapters = nn.ParameterDict()

    def proj(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """The projection `name` of h, through its adapter when it has one."""
        y = getattr(self, name)(h)
        if f"{name}_A" in self.adapters:
            y = y + (h @ self.adapters[f"{name}_A"].T) @ self.adapters[f"{name}_B"].T
        return y

    def forward(self, x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, mask: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple]:
        """x [B, T, D] at rope positions pos [B, T], after the keys and values
        `past` of earlier inputs; mask [B, 1, T, past + T] (True = attend).
        Returns the output and this layer's keys and values, past included."""
        c = self.cfg
        B, T, _ = x.shape
        h = rms_norm(x, self.input_layernorm, c.eps)
        q = rope(self.proj("q_proj", h).view(B, T, c.n_head, c.head_dim), pos, inv).transpose(1, 2)
        k = rope(self.proj("k_proj", h).view(B, T, c.n_head_kv, c.head_dim), pos, inv).transpose(1, 2)
        v = self.proj("v_proj", h).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        rep = c.n_head // c.n_head_kv
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
        x = x + self.proj("o_proj", a.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, self.post_attention_layernorm, c.eps)
        return x + self.proj("down_proj", F.silu(self.proj("gate_proj", h)) * self.proj("up_proj", h)), (k, v)


class Merger(nn.Module):
    """The compositional embedder: k > 1 token embeddings -> one input embedding."""

    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.dim
        self.heads = cfg.merger_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d + d // 2, d)
        self.v_proj = nn.Linear(d + d // 2, d)
        self.out_proj = nn.Linear(d, d)
        self.pos = nn.Parameter(torch.randn(cfg.max_steps, d // 2) * math.sqrt(2.0 / (cfg.max_steps + d // 2)))

    def forward(self, e: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """Merges e [N, S, D] (rows beyond each group's n [N] tokens are ignored) into [N, D]."""
        N, S, D = e.shape
        valid = torch.arange(S)[None, :] < n[:, None]  # [N, S]
        m = (e * valid[..., None]).sum(1) / n[:, None]
        hs = D // self.heads
        u = torch.cat([e, self.pos[:S].expand(N, S, -1)], -1)
        q = self.q_proj(m).view(N, self.heads, 1, hs)
        k = self.k_proj(u).view(N, S, self.heads, hs).transpose(1, 2)
        v = self.v_proj(u).view(N, S, self.heads, hs).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
        return m + self.out_proj(o.reshape(N, D))


class StopHead(nn.Module):
    """Linear -> SiLU -> Linear -> SiLU -> Linear(D, 1): the logit of stopping after a micro step."""

    def __init__(self, d: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The stop logits of features h [..., D], [...]."""
        return self.net(h).squeeze(-1)


class HAMburger(nn.Module):
    """A base with trainable grafted modules, and optionally its first
    `tuned_layers` layers trainable too (`tuned_parameters`) and low-rank
    adapters of rank `lora_rank` on the others (`adapter_parameters`); the
    rest of the base is frozen."""

    def __init__(self, cfg: Config, tuned_layers: int = 0, lora_rank: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tuned_layers = tuned_layers
        self.lora_rank = lora_rank
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.lm_head: nn.Parameter | None = None  # None: tied to the embedding
        self.merger = Merger(cfg)
        self.micro = nn.ModuleList(Layer(cfg) for _ in range(cfg.micro_layers))
        self.stop_head = StopHead(cfg.dim)
        # A draft head's copy matrix (`copying`), where it reads copy candidates: `add_copy`.
        self.copy_proj: nn.Linear | None = None
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        if lora_rank > 0:
            for layer in self.layers[tuned_layers:]:
                layer.add_adapters(lora_rank)
        self.requires_grad_(False)
        for p in self.grafted_parameters():
            p.requires_grad_(True)
        for p in self.tuned_parameters():
            p.requires_grad_(True)
        for p in self.adapter_parameters():
            p.requires_grad_(True)

    def grafted_parameters(self):
        """The grafted modules' parameters: merger, micro decoder and stop head."""
        yield from self.merger.parameters()
        yield from self.micro.parameters()
        yield from self.stop_head.parameters()

    def tuned_parameters(self):
        """The parameters of the base layers that are fine-tuned (the first `tuned_layers`)."""
        for layer in self.layers[: self.tuned_layers]:
            yield from layer.parameters()

    def adapter_parameters(self):
        """The base layers' low-rank adapters (none unless `lora_rank`)."""
        for layer in self.layers:
            yield from layer.adapters.values()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapters under the original key of the weight each adapts,
        `.weight` replaced by `.lora_A` ([rank, in]) and `.lora_B` ([out, rank]):
        what ships beside the grafted modules (`W + B A` is the tuned weight)."""
        sd = {}
        for i, layer in enumerate(self.layers):
            for key, t in layer.adapters.items():
                name, ab = key.rsplit("_", 1)
                sd[f"model.model.layers.{i}.{PROJECTION_PREFIX[name]}.{name}.lora_{ab}"] = t
        return sd

    def merge_adapters(self) -> None:
        """Folds every adapter into its weight (what `export` writes)."""
        for layer in self.layers:
            layer.merge_adapters()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head(h), for h of any leading shape, as one matrix product of
        its rows (a 3-D view that is not contiguous, as the micro decoder's
        outputs are, takes a path some 10 times slower on the CPU)."""
        w = self.embed.weight if self.lm_head is None else self.lm_head
        return F.linear(h.reshape(-1, h.shape[-1]), w).view(*h.shape[:-1], w.shape[0])

    def base(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, past: list | None = None,
             want_kv: bool = False) -> tuple[list[torch.Tensor], list | None]:
        """Runs the base over input embeddings x [B, T, D] (after the keys and
        values `past` of earlier inputs, one pair per layer); returns the F
        features [B, T, D] (the last one after the final norm) and, when
        asked, every layer's keys and values."""
        feats, kv = [], []
        last = self.cfg.n_layer - 1
        for i, layer in enumerate(self.layers):
            x, layer_kv = layer(x, pos, self.inv_freq, mask, None if past is None else past[i])
            if want_kv:
                kv.append(layer_kv)
            if i in self.cfg.feature_layers and i != last:
                feats.append(x)
        feats.append(rms_norm(x, self.norm, self.cfg.eps))
        return feats, kv if want_kv else None

    def add_copy(self, longest: int) -> None:
        """Gives the micro decoder a new copy matrix (zero) for candidates of
        n-grams up to `longest` (`copying`): it then drafts as before until trained."""
        self.copy_proj = copy_matrix(longest, self.cfg.dim).to(self.embed.weight.device)

    def copy_longest(self) -> int:
        """The longest n-gram the micro decoder copies from (0: it reads no copy candidates)."""
        return 0 if self.copy_proj is None else self.copy_proj.in_features // self.cfg.dim

    def micro_decode(self, feats: torch.Tensor, tokens: torch.Tensor, copies: torch.Tensor | None = None) -> torch.Tensor:
        """The micro decoder over [features (F), embed(tokens) (k-1)] for N macro steps:
        feats [N, F, D], tokens [N, k-1]; returns out_1..out_{k-1} [N, k-1, D].
        With a copy matrix, each token's embedding gains its copy candidates'
        `copies` [N, k-1, M] (`copying.embed_candidates`; required then)."""
        e = self.embed(tokens)
        if self.copy_proj is not None:
            e = e + embed_candidates(self.embed, self.copy_proj, copies).to(e.dtype)
        x = torch.cat([feats, e], 1)
        N, T, _ = x.shape
        pos = torch.arange(T).expand(N, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        for layer in self.micro:
            x, _ = layer(x, pos, self.inv_freq, mask)
        return x[:, feats.shape[1]:]

    @staticmethod
    def from_checkpoint(ckpt: Path, tuned_layers: int = 0, lora_rank: int = 0) -> "HAMburger":
        """Loads a checkpoint directory (`model.safetensors` in the original layout)."""
        cfg = Config.load(ckpt)
        model = HAMburger(cfg, tuned_layers, lora_rank)
        sd = load_file(str(ckpt / "model.safetensors"))
        model.load_original(sd)
        return model

    def load_original(self, sd: dict[str, torch.Tensor], grafted_only: bool = False) -> None:
        """Copies tensors named as in the original checkpoint into this model.
        With `grafted_only`, `sd` holds what training changed: every grafted
        tensor, and any base tensors it has replace the base's."""
        own = self.original_state()
        need = self.original_state(grafted_only=True) if grafted_only else own
        missing = [k for k in need if k not in sd and k != "model.lm_head.weight"]
        if missing:
            raise KeyError(f"checkpoint lacks {missing[0]} (and {len(missing) - 1} more)")
        with torch.no_grad():
            for k, t in own.items():
                if k in sd:
                    t.copy_(sd[k].float())
            self.load_adapters(sd)
            if not grafted_only and "model.lm_head.weight" in sd and not torch.equal(sd["model.lm_head.weight"], sd["model.model.embed_tokens.weight"]):
                self.lm_head = nn.Parameter(sd["model.lm_head.weight"].float(), requires_grad=False)

    def load_adapters(self, sd: dict[str, torch.Tensor]) -> None:
        """Copies the adapters in `sd` (keys as `adapter_state` names them)
        into this model, adding those it lacks, frozen (an export, or a
        `--init` from a run that had them: they are then part of the base)."""
        for k, t in sd.items():
            if ".lora_" not in k:
                continue
            i, name, ab = int(k.split(".")[3]), k.split(".")[-2], k.rsplit("_", 1)[1]
            layer = self.layers[i]
            if f"{name}_{ab}" not in layer.adapters:
                layer.add_adapters(t.shape[0] if ab == "A" else t.shape[1])
                layer.adapters.requires_grad_(False)
            with torch.no_grad():
                layer.adapters[f"{name}_{ab}"].copy_(t.float())

    def original_state(self, grafted_only: bool = False) -> dict[str, torch.Tensor]:
        """This model's tensors under the original checkpoint's key names
        (`grafted_only`: the grafted modules' alone)."""
        def layer(prefix: str, l: Layer) -> dict[str, torch.Tensor]:
            """One Llama layer's tensors under `prefix`."""
            out = {f"{prefix}.input_layernorm.weight": l.input_layernorm,
                   f"{prefix}.post_attention_layernorm.weight": l.post_attention_layernorm}
            for n in ("q", "k", "v", "o"):
                out[f"{prefix}.self_attn.{n}_proj.weight"] = getattr(l, f"{n}_proj").weight
            for n in ("gate", "up", "down"):
                out[f"{prefix}.mlp.{n}_proj.weight"] = getattr(l, f"{n}_proj").weight
            return out

        sd: dict[str, torch.Tensor] = {}
        if not grafted_only:
            sd["model.model.embed_tokens.weight"] = self.embed.weight
            sd["model.model.norm.weight"] = self.norm
            if self.lm_head is not None:
                sd["model.lm_head.weight"] = self.lm_head
            for i, l in enumerate(self.layers):
                sd.update(layer(f"model.model.layers.{i}", l))
        m = self.merger
        for n in ("q", "k", "v"):
            lin = getattr(m, f"{n}_proj")
            sd[f"comp_embedder.merger.{n}_proj.weight"] = lin.weight
            sd[f"comp_embedder.merger.{n}_proj.bias"] = lin.bias
        sd["comp_embedder.merger.pos"] = m.pos
        sd["comp_embedder.out_proj.weight"] = m.out_proj.weight
        sd["comp_embedder.out_proj.bias"] = m.out_proj.bias
        for i, l in enumerate(self.micro):
            sd.update(layer(f"micro_step_decoder.decoders.{i}", l))
        for i, lin in zip((0, 2, 4), (self.stop_head.net[0], self.stop_head.net[2], self.stop_head.net[4])):
            sd[f"micro_step_decoder.stop_head.{i}.weight"] = lin.weight
            sd[f"micro_step_decoder.stop_head.{i}.bias"] = lin.bias
        if self.copy_proj is not None:
            sd[COPY_KEY] = self.copy_proj.weight
        return sd

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What training changes, under the original key names: the grafted
        modules, the tuned base layers and the adapters (what differs from the base)."""
        sd = self.original_state(grafted_only=True) | self.adapter_state()
        for i, l in enumerate(self.layers[: self.tuned_layers]):
            for k, v in self.original_state().items():
                if k.startswith(f"model.model.layers.{i}."):
                    sd[k] = v
        return sd


COPY_KEY = "micro_step_decoder.copy.weight"
"""The copy matrix's key among the original names: only a draft head has
one (`draft_head.copy.weight` in an export, the GGUF's `draft_copy.weight`)."""


@torch.no_grad()
def greedy(
    model: HAMburger, prompt: list[int], n: int, confidence: float, trace: list | None = None
) -> list[list[int]]:
    """Greedy HAMburger decoding with the runtime's semantics (docs/model.md):
    the macro steps' tokens, up to `n` tokens or the step that emits an end
    token; a step goes on while the stop head's "go on" probability is at
    least `confidence`. The tool's one decode loop (`hamburger-train greedy`
    checks a checkpoint with it against `hamburger-cli`). Given a `trace`
    list, each token's [top-2 logit margin, stop probability] is appended to
    it, so that a comparison can tell a near-tie from a difference."""
    cfg = model.cfg
    emb = model.embed(torch.tensor(prompt))
    pos = list(range(len(prompt)))
    steps: list[list[int]] = []
    n_out = 0
    while n_out < n:
        T = emb.shape[0]
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        feats, _ = model.base(emb[None], torch.tensor(pos)[None], mask)
        f = torch.stack([x[0, -1] for x in feats])[None]  # [1, F, D]
        out, toks = f[0, -1], []
        while True:
            logits = model.logits(out)
            toks.append(int(logits.argmax()))
            p_stop = torch.sigmoid(model.stop_head(out)).item()
            if trace is not None:
                top2 = logits.topk(2).values
                trace.append([(top2[0] - top2[1]).item(), p_stop])
            if (1 - p_stop) < confidence or len(toks) == cfg.max_steps:
                break
            out = model.micro_decode(f, torch.tensor(toks)[None])[0, -1]
        steps.append(toks)
        n_out += len(toks)
        if any(t in cfg.eos for t in toks):
            break
        e = model.embed(torch.tensor(toks))
        merged = e[0] if len(toks) == 1 else model.merger(e[None], torch.tensor([len(toks)]))[0]
        emb = torch.cat([emb, merged[None]])
        pos.append(len(prompt) + n_out - 1)
    return steps
