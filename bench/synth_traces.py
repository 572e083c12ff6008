#!/usr/bin/env python3
"""Writes synthetic allocation traces (format: bench/traces/README.md) for patterns
the real traces in bench/traces cover thinly, so tuning is checked beyond them:

  synth-kvcache   generation with a growing KV cache per layer (re-allocated one
                  step larger, as a cat() does), batch and prompt random per request,
                  many small temporaries between
  synth-offload   training with activations offloaded: big buffers freed early in
                  forward and allocated again in backward (sizes vary per step)
  synth-mixed     mixed small and large requests, log-uniform 512 B .. 768 MiB,
                  random lifetimes, the pattern repeated per iteration with jitter
  synth-ckpt-dyn  checkpointing (recomputation) with a random sequence length per step
  synth-seqsched  training whose sequence length follows a warm-up schedule (short
                  sequences first, longer every few steps) and whose batch varies per
                  step (tokens per batch about constant), so the peak keeps growing
                  after the first iterations in steps of similar size
  synth-moe       mixture-of-experts training: per layer, each of 8 experts gets the
                  tokens the router sends it (random, uneven, different every step)
  synth-vision    vision training at a variable resolution: every step draws an image
                  size (224..640) and a batch that keeps pixels per batch about
                  constant; feature maps at four strides, attention over the last
                  stage's tokens (quadratic in them)

Deterministic (fixed seeds). Usage: python3 bench/synth_traces.py [OUTDIR]
(default bench/traces/synthetic).

  python3 bench/synth_traces.py --variants N OUTDIR

writes, instead, N more traces of each pattern, NAME-vK.trace.gz for K = 1..N, from
other seeds: jobs of the same kinds that no setting was tuned on, to check that a
change holds beyond the traces it was measured on.
"""
import gzip
import os
import random
import sys

MiB = 1 << 20


class writer:
    def __init__(self, path, name):
        self.f = gzip.open(path, "wt", compresslevel=6)
        self.f.write(f"# workload {name}\n# source bench/synth_traces.py\n")
        self.next = 0
        self.live = set()

    def a(self, size, stream=0):
        i = self.next
        self.next += 1
        self.f.write(f"a {i} {int(size)} {stream}\n")
        self.live.add(i)
        return i

    def free(self, i):
        if i in self.live:
            self.live.remove(i)
            self.f.write(f"f {i}\n")

    def it(self, n):
        self.f.write(f"i {n}\n")

    def close(self):
        self.f.close()


def kvcache(w, r):
    layers, heads, hd = 22, 4, 64
    weights = [w.a(r.choice([8, 16, 22]) * MiB) for _ in range(60)]
    for it in range(8):
        w.it(it)
        for _ in range(3):  # requests per iteration
            batch, prompt, new = r.randint(1, 32), r.randint(16, 512), r.randint(32, 192)
            kv = [None] * layers
            for t in range(prompt, prompt + new):
                for l in range(layers):
                    tmp = [w.a(r.choice([4096, 8192, 65536, batch * 2048 * 2])) for _ in range(3)]
                    nk = w.a(2 * batch * heads * hd * t * 2)  # k and v, bf16, grown by one token
                    if kv[l] is not None:
                        w.free(kv[l])
                    kv[l] = nk
                    for x in tmp:
                        w.free(x)
                logits = w.a(batch * 32000 * 4)
                w.free(logits)
            for x in kv:
                w.free(x)
    for x in weights:
        w.free(x)


def offload(w, r):
    params = [w.a(r.choice([12, 24, 48]) * MiB) for _ in range(80)]
    for it in range(12):
        w.it(it)
        seq = r.randint(256, 2048)
        acts = []
        for l in range(24):
            a = w.a(8 * seq * 2048 * 2)
            t = [w.a(8 * seq * r.choice([2048, 8192]) * 2) for _ in range(2)]
            for x in t:
                w.free(x)
            acts.append(a)
            if l % 2 == 1:  # offloaded to host: freed on the device
                w.free(acts[-2])
                acts[-2] = None
        grads = []
        for l in reversed(range(24)):
            if acts[l] is None:
                acts[l] = w.a(8 * seq * 2048 * 2)  # brought back
            g = w.a(8 * seq * 2048 * 2)
            t = w.a(8 * seq * 8192 * 2)
            w.free(t)
            w.free(acts[l])
            grads.append(g)
            if len(grads) > 2:
                w.free(grads.pop(0))
        for g in grads:
            w.free(g)
    for x in params:
        w.free(x)


def mixed(w, r):
    base = []
    for _ in range(3000):
        size = int(2 ** r.uniform(9, 29.6))
        life = int(r.expovariate(1 / 40)) + 1
        base.append((size, life))
    pending = []
    for it in range(10):
        w.it(it)
        for k, (size, life) in enumerate(base):
            size = max(512, int(size * r.uniform(0.7, 1.3)))
            pending.append((k + life, w.a(size)))
            pending.sort()
            while pending and pending[0][0] <= k:
                w.free(pending.pop(0)[1])
        for _, i in pending:
            w.free(i)
        pending = []


def ckpt_dyn(w, r):
    params = [w.a(r.choice([8, 32]) * MiB) for _ in range(96)]
    opt = [w.a(64 * MiB) for _ in range(96)]
    for it in range(12):
        w.it(it)
        seq = r.choice([128, 256, 512, 768, 1024, 1536, 2048])
        b = 8
        ckpts = []
        for l in range(24):  # forward: keep only each layer's input
            ckpts.append(w.a(b * seq * 2048 * 2))
            t = [w.a(b * seq * x * 2) for x in (2048, 6144, 8192)]
            for x in t:
                w.free(x)
        logits = w.a(b * seq * 50272 * 4)
        for l in reversed(range(24)):  # backward: recompute the layer, then its grads
            re = [w.a(b * seq * x * 2) for x in (2048, 2048, 8192, 8192)]
            g = [w.a(b * seq * 2048 * 2) for _ in range(2)]
            for x in re + g[:1]:
                w.free(x)
            w.free(ckpts[l])
            w.free(g[1])
            if l == 23:
                w.free(logits)
    for x in params + opt:
        w.free(x)


def seqsched(w, r):
    params = [w.a(r.choice([16, 48]) * MiB) for _ in range(64)]
    opt = [w.a(r.choice([32, 96]) * MiB) for _ in range(64)]
    sched = [256, 256, 512, 512, 768, 1024, 1024, 1536, 2048, 2048, 3072, 4096, 4096, 4096]
    for it, seq in enumerate(sched):
        w.it(it)
        b = max(1, 16384 // seq) * r.choice([1, 2]) // 2 or 1  # tokens per batch about constant
        h = 2048
        acts = []
        for l in range(16):  # forward: every layer keeps its activations for backward
            acts += [w.a(b * seq * x * 2) for x in (h, h, 4 * h)]
            att = w.a(b * 16 * seq * seq * 2)  # attention scores, quadratic in seq
            tmp = w.a(b * seq * 4 * h * 2)
            w.free(tmp)
            w.free(att)
        logits = w.a(b * seq * 32000 * 4)
        w.free(logits)
        for l in reversed(range(16)):  # backward: grads, then the layer's activations go
            g = [w.a(b * seq * x * 2) for x in (h, 4 * h)]
            att = w.a(b * 16 * seq * seq * 2)
            w.free(att)
            for x in acts[3 * l:3 * l + 3] + g:
                w.free(x)
        grads = [w.a(64 * MiB) for _ in range(8)]  # bucketed gradient all-reduce
        for x in grads:
            w.free(x)
    for x in params + opt:
        w.free(x)


def moe(w, r):
    params = [w.a(r.choice([8, 24, 56]) * MiB) for _ in range(128)]
    h, experts, tokens = 1536, 8, 8192
    for it in range(14):
        w.it(it)
        acts = []
        for l in range(12):
            acts.append(w.a(tokens * h * 2))
            router = w.a(tokens * experts * 4)
            weights = [r.random() ** 2 + 0.05 for _ in range(experts)]  # uneven routing
            s = sum(weights)
            counts = [int(tokens * 2 * x / s) for x in weights]  # top-2 routing
            for c in counts:
                inp = w.a(c * h * 2)
                mid = w.a(c * 4 * h * 2)
                acts += [inp, mid]
                out = w.a(c * h * 2)
                w.free(out)
            w.free(router)
        for x in reversed(acts):  # backward: a grad per saved tensor, then both go
            g = w.a(max(512, r.choice([1, 2]) * 4096) if x % 3 == 0 else 2 * MiB)
            w.free(g)
            w.free(x)
    for x in params:
        w.free(x)


def vision(w, r):
    params = [w.a(r.choice([4, 9, 18]) * MiB) for _ in range(96)]
    opt = [w.a(r.choice([8, 18, 36]) * MiB) for _ in range(96)]
    stages = [(4, 96, 3), (8, 192, 3), (16, 384, 9), (32, 768, 3)]  # stride, channels, blocks
    for it in range(16):
        w.it(it)
        res = r.choice([224, 256, 320, 384, 448, 512, 640])
        b = max(2, int(48 * (224 / res) ** 2))
        b = max(2, b + r.randint(-(b // 4), b // 4))
        acts = [(w.a(b * 3 * res * res * 2), b * 3 * res * res * 2)]
        for stride, ch, blocks in stages:  # forward: each block keeps what backward needs
            hw = (res // stride) ** 2
            for _ in range(blocks):
                for n in (b * ch * hw * 2, b * ch * hw * 2, b * 4 * ch * hw * 2, ch * 8):
                    acts.append((w.a(n), n))
                tmp = w.a(b * 4 * ch * hw * 2)
                w.free(tmp)
        tokens = (res // 32) ** 2
        n = b * 12 * tokens * tokens * 2
        acts.append((w.a(n), n))
        logits = w.a(b * 1000 * 4)
        w.free(logits)
        grad = None
        for x, n in reversed(acts):  # backward: the running gradient, then the activation
            g = w.a(n)
            if grad is not None:
                w.free(grad)
            w.free(x)
            grad = g
        w.free(grad)
        buckets = [w.a(25 * MiB) for _ in range(6)]  # gradient all-reduce buckets
        for x in buckets:
            w.free(x)
    for x in params + opt:
        w.free(x)


PATTERNS = [("synth-kvcache", kvcache, 1), ("synth-offload", offload, 2), ("synth-mixed", mixed, 3),
            ("synth-ckpt-dyn", ckpt_dyn, 4), ("synth-seqsched", seqsched, 5), ("synth-moe", moe, 6),
            ("synth-vision", vision, 7)]


USAGE = "usage: synth_traces.py [OUTDIR] | --variants N OUTDIR"


def write(out, name, fn, seed):
    w = writer(os.path.join(out, name + ".trace.gz"), name)
    fn(w, random.Random(seed))
    w.close()
    print(f"{out}/{name}.trace.gz: {w.next} allocations")


def main():
    args = sys.argv[1:]
    variants = 0
    if args[:1] == ["--variants"]:
        if len(args) != 3:
            sys.exit(USAGE)
        variants, args = int(args[1]), args[2:]
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(USAGE)
    out = args[0] if args else os.path.join(os.path.dirname(__file__), "traces", "synthetic")
    os.makedirs(out, exist_ok=True)
    for name, fn, seed in PATTERNS:
        if variants == 0:
            write(out, name, fn, seed)
        for k in range(1, variants + 1):
            write(out, f"{name}-v{k}", fn, 1000 * k + seed)


if __name__ == "__main__":
    main()
