#!/usr/bin/env python3
"""Train a small Llama-style model and serve it from a second process, synced by refit.

The trainer (this process) keeps fp32 master weights and steps AdamW on a corpus this script
generates; after every optimizer step it publishes the BF16 cast of its parameters through a
refit.Sender. The server (a second process, started with multiprocessing's spawn) holds its own
BF16 model whose parameters are attached to a refit.Receiver: every version is applied straight
into those parameters, then the server greedily generates a few tokens and reports back. Each
step the server's parameters are hashed (SHA-256 of every parameter's bits, computed with
hashlib, not by refit) and compared with the hash of the trainer's cast: "bit-exact" or the
script fails.

    PYTHONPATH=build/python python3 examples/train_and_serve.py --steps 20

Model: RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLP; byte-level
tokens. The defaults make ~12.8M parameters (--dim, --layers, --heads, --kv-heads, --hidden).
"""

import argparse
import hashlib
import math
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

import refit

# ---------------------------------------------------------------------------------------------
# The model


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def rotary_tables(seq_len, head_dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query attention: kv_heads key/value heads shared by heads query heads."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos[:t], sin[:t]), apply_rotary(k, cos[:t], sin[:t])
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.float().masked_fill(causal, float("-inf")).softmax(-1).to(q.dtype)
        return self.o_proj((scores @ v).transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(256, a.dim)
        self.layers = nn.ModuleList(
            Block(a.dim, a.heads, a.kv_heads, a.hidden) for _ in range(a.layers)
        )
        self.norm = RMSNorm(a.dim)
        self.lm_head = nn.Linear(a.dim, 256, bias=False)
        cos, sin = rotary_tables(a.seq + a.gen_tokens + 64, a.dim // a.heads)
        self.register_buffer("cos", cos, persistent=False)  # derived, never synced
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.lm_head(self.norm(x))


@torch.no_grad()
def generate(model, prompt, n):
    tokens = torch.tensor([list(prompt.encode())])
    for _ in range(n):
        next_token = model(tokens)[0, -1].float().argmax()
        tokens = torch.cat([tokens, next_token.view(1, 1)], dim=1)
    return bytes(tokens[0, len(prompt.encode()) :].tolist()).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Data: a corpus generated from a tiny grammar


def make_corpus(sentences=4000, seed=0):
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird"]
    verbs = ["sees", "likes", "follows", "paints", "finds", "teaches"]
    objects = ["the river", "a red ball", "the moon", "an apple", "the garden", "a quiet song"]
    tails = [".", " today.", " again.", " at night.", " with joy."]
    text = " ".join(
        f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(tails)}"
        for _ in range(sentences)
    )
    return torch.tensor(list(text.encode()), dtype=torch.long)


def batch(corpus, size, seq, gen):
    starts = torch.randint(0, corpus.numel() - seq - 1, (size,), generator=gen)
    windows = torch.stack([corpus[s : s + seq + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


# ---------------------------------------------------------------------------------------------
# Sync


def bf16_cast(model):
    """The trainer's published weights: every parameter cast to BF16 (new contiguous tensors)."""
    return {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}


def bits_sha256(named):
    """SHA-256 of names and bits, independent of refit's own digests."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        h.update(name.encode() + b"\0")
        h.update(memoryview(tensor.detach().view(torch.int16).numpy()))
    return h.hexdigest()


def config_text(work_dir):
    return f"""
[sender]
state_dir = "{work_dir}/sender"
receivers = ["server"]
encoding = "auto"
ack_timeout_s = 120

[receiver]
id = "server"
state_dir = "{work_dir}/server"

[transport]
name = "disk"

[transport.disk]
dir = "{work_dir}/sync"
fsync = false   # a temp dir on one machine; keep true on a shared filesystem
"""


def serve(conn, config, args):
    """The server process: applies every version into its BF16 model and generates with it."""
    torch.set_num_threads(1)
    torch.manual_seed(1234)  # its own random init: the first (full) version replaces it
    model = Llama(args).to(torch.bfloat16).eval()
    receiver = refit.Receiver(config)
    receiver.attach(model.named_parameters())  # refit writes into these parameters
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        version, deadline, applied = message[1], time.monotonic() + 120, []
        while receiver.version < version and time.monotonic() < deadline:
            try:
                stats = receiver.poll()
            except refit.VersionMismatchError:
                continue  # it asked for a full sync; the sender sends one
            if stats is None:
                time.sleep(0.002)
            else:
                applied.append(stats.seconds)
        text = generate(model, args.prompt, args.gen_tokens)
        conn.send((receiver.version, sum(applied), bits_sha256(model.named_parameters()), text))


def report(step, loss, stats, served, trainer_hash):
    version, apply_s, server_hash, text = served
    exact = version == stats.version and server_hash == trainer_hash
    print(
        f"{step:4d} {loss:7.3f} {stats.version:5d} {'full' if stats.full else 'delta':>5} "
        f"{100 * stats.density:8.3f}% {stats.payload_bytes / 1e6:9.3f} MB "
        f"{stats.dense_fraction:8.4f}x {stats.seconds:9.3f} {apply_s:7.3f}  "
        f"{'bit-exact' if exact else 'MISMATCH'}  {text!r}",
        flush=True,
    )
    return exact


def train(args, work_dir):
    torch.manual_seed(0)
    corpus, gen = make_corpus(), torch.Generator().manual_seed(0)
    model = Llama(args)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)  # fmt: skip
    config = config_text(work_dir)
    sender = refit.Sender(config)
    parent, child = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(child, config, args))
    server.start()
    print(f"model: {params / 1e6:.2f}M parameters, BF16 cast {2 * params / 1e6:.2f} MB; "
          f"{args.steps} steps at lr {args.lr:g}; work dir {work_dir}")  # fmt: skip
    print("step    loss  ver.  kind   density    payload   vs dense  publish s apply s  check"
          "      generated")  # fmt: skip
    all_exact = True
    try:
        for step in range(1, args.steps + 1):
            inputs, targets = batch(corpus, args.batch, args.seq, gen)
            loss = F.cross_entropy(model(inputs).view(-1, 256), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            cast = bf16_cast(model)
            stats = sender.publish(cast)
            parent.send(("version", stats.version))
            served = parent.recv()
            all_exact &= report(step, loss.item(), stats, served, bits_sha256(cast.items()))
    finally:
        parent.send(("stop",))
        server.join(timeout=60)
    return all_exact and server.exitcode == 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024, help="SwiGLU hidden size")
    p.add_argument("--seq", type=int, default=48, help="training sequence length")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--prompt", default="the cat ")
    p.add_argument("--gen-tokens", type=int, default=16)
    p.add_argument("--work-dir", help="keep the sync state here (default: a temp dir, removed)")
    return p.parse_args()


def main():
    args = parse_args()
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="refit-train-and-serve-")
    os.makedirs(work_dir, exist_ok=True)
    try:
        ok = train(args, work_dir)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    print("bit-exact: yes, every step" if ok else "bit-exact: NO", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
