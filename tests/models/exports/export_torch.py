#!/usr/bin/env python3
"""Export public PyTorch architectures to ONNX with their own tools.

    python export_torch.py OUTDIR [NAME ...]

Runs in the venv of tests/models/exports/torch.txt. Every model is built
from its library's own code or config with random weights (nothing is
downloaded) and exported by that library's own exporter path:
torch.onnx.export (the TorchScript exporter, opset 17) for torchvision,
transformers and the UNet; ultralytics' `model.export(format="onnx")` for
YOLOv8n.

For each model NAME it writes OUTDIR/NAME.onnx, its inputs (NAME.input.npy,
or NAME.input0.npy, NAME.input1.npy, ... for several),
NAME.expected.npy: onnxruntime's CPU output on the same file with every
graph optimization disabled (the plain reading of the graph), and NAME.tol:
the tolerance a comparison with it may use, 1e-4 unless the reference's
own noise is larger (see `tolerance`: onnxruntime's optimized and
unoptimized outputs differ by up to ~3e-4 on the deepest nets, and from
a float64 evaluation of the PyTorch module by up to ~1e-3). It prints
one line per model: inputs, outputs, node count, file size, export time,
reference noise and tolerance.

Random initialisation leaves some parameters at constants that would hide
a wrong kernel (BatchNorm gamma 1 / beta 0, zero-initialised heads, layer
scales of 1e-6): `randomize` replaces every floating parameter and buffer
with values of a similar scale, and BatchNorm statistics come from a few
train-mode passes over random data. Deterministic: seeded per model.
"""

import copy
import math
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

OPSET = 17
torch.backends.mha.set_fastpath_enabled(False)


def randomize(model, seed):
    """Give every parameter non-trivial values of its layer's scale and
    BatchNorm layers non-trivial running statistics."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith("weight"):  # norm scales
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:  # biases, layer scales, ...
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def calibrate_bn(model, shape, seed, passes=3):
    """BatchNorm running statistics from train-mode passes on random data
    (momentum None: a cumulative average)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(passes):
            model(torch.randn(shape, generator=g))
    model.eval()


def onnxruntime(path, feeds, optimize):
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def tolerance(want, other, truth):
    """The comparison tolerance: 1e-4, or three times the reference's own
    noise where that is larger. The noise is the largest scaled difference
    |a - b| / (1 + |b|) of onnxruntime's unoptimized output from its
    optimized one (fused kernels sum in another order) and from the same
    PyTorch module evaluated in float64 (the exact answer, up to float64
    rounding): an f32 implementation as accurate as onnxruntime differs from
    it by up to about twice that. Tolerances step through 1, 2 and 5 times
    powers of ten."""
    def scaled(a, b):
        return float(np.max(np.abs(a - b) / (1 + np.abs(b))))
    noise = scaled(other, want)
    if truth is not None and truth.shape == want.shape:
        noise = max(noise, scaled(want, truth))
    steps = [m * 10.0**e for e in range(-4, 0) for m in (1, 2, 5)]
    return noise, next(t for t in steps if t >= 3 * noise)


def float64_output(module, args):
    """The module's first output evaluated in float64 (integer inputs as
    they are); None when the module cannot run in float64."""
    try:
        with torch.no_grad():
            m = copy.deepcopy(module).double()
            y = m(*[a.double() if a.is_floating_point() else a for a in args])
        while isinstance(y, (list, tuple)):
            y = y[0]
        return y.detach().numpy()
    except Exception as e:  # noqa: BLE001 - the check is optional
        print(f"  (no float64 evaluation: {type(e).__name__}: {e})", file=sys.stderr)
        return None


def save(out, name, path, feeds, t_export, truth=None):
    """Inputs, reference output and a one-line description."""
    model = onnx.load(path, load_external_data=False)
    names = [i.name for i in model.graph.input]
    assert list(feeds) == names, (names, list(feeds))
    if len(feeds) == 1:
        np.save(os.path.join(out, f"{name}.input.npy"), next(iter(feeds.values())))
    else:
        for i, v in enumerate(feeds.values()):
            np.save(os.path.join(out, f"{name}.input{i}.npy"), v)
    outs = onnxruntime(path, feeds, optimize=False)
    np.save(os.path.join(out, f"{name}.expected.npy"), outs[0].astype(np.float32))
    noise, tol = tolerance(outs[0], onnxruntime(path, feeds, optimize=True)[0], truth)
    with open(os.path.join(out, f"{name}.tol"), "w") as f:
        f.write(f"{tol:g}\n")
    ins = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
    outs_d = ", ".join(f"{o.name} {list(r.shape)}" for o, r in zip(model.graph.output, outs))
    size = os.path.getsize(path) / 2**20
    print(f"{name}: {ins} -> {outs_d}; {len(model.graph.node)} nodes, {size:.1f} MiB, exported in {t_export:.1f} s;"
          f" reference noise {noise:.2g}, tolerance {tol:g}", flush=True)


def export(out, name, model, args, input_names, output_names, seed):
    path = os.path.join(out, f"{name}.onnx")
    truth = float64_output(model, args)  # before the exporter traces it
    t0 = time.time()
    torch.onnx.export(model, args, path, opset_version=OPSET, dynamo=False,
                      input_names=input_names, output_names=output_names, do_constant_folding=True)
    t = time.time() - t0
    feeds = {n: a.numpy() for n, a in zip(input_names, args)}
    save(out, name, path, feeds, t, truth)


def image(seed, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 7))


# -- torchvision --------------------------------------------------------------

def torchvision_model(out, name, ctor, shape, seed, output="logits", **kw):
    torch.manual_seed(seed)
    model = randomize(ctor(weights=None, **kw), seed)
    calibrate_bn(model, (2,) + shape[1:], seed)

    class First(nn.Module):  # segmentation models return a dict
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            y = self.m(x)
            return y["out"] if isinstance(y, dict) else y

    export(out, name, First(model).eval(), (image(seed, shape),), ["input"], [output], seed)


def raft_small(out, seed):
    """torchvision's RAFT (small) optical flow between two frames: a
    correlation pyramid looked up with GridSample (bilinear, align_corners,
    zeros) around the current flow, a ConvGRU update unrolled over four
    iterations, and the flow upsampled by interpolation."""
    import torchvision

    torch.manual_seed(seed)
    model = randomize(torchvision.models.optical_flow.raft_small(weights=None), seed).eval()

    class Flow(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, image1, image2):
            return self.m(image1, image2, num_flow_updates=4)[-1]

    frames = (image(seed, (1, 3, 128, 128)), image(seed + 1, (1, 3, 128, 128)))
    export(out, "raft_small", Flow(model), frames, ["image1", "image2"], ["flow"], seed)


# -- UNet (the 2015 architecture: double convs, max-pool down, ConvTranspose up)

class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, cin=3, classes=4, widths=(16, 32, 64, 128, 256)):
        super().__init__()
        self.inc = DoubleConv(cin, widths[0])
        self.down = nn.ModuleList(DoubleConv(a, b) for a, b in zip(widths, widths[1:]))
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths, widths[1:]))
        self.dec = nn.ModuleList(DoubleConv(2 * a, a) for a in widths[:-1])
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = [self.inc(x)]
        for d in self.down:
            skips.append(d(nn.functional.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up, dec in reversed(list(zip(self.up, self.dec))):
            x = dec(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)


def unet(out, seed):
    torch.manual_seed(seed)
    model = randomize(UNet(), seed)
    shape = (1, 3, 128, 128)
    calibrate_bn(model, (2,) + shape[1:], seed)
    export(out, "unet", model.eval(), (image(seed, shape),), ["input"], ["mask"], seed)


# -- A 3-D UNet (volumetric segmentation: Conv3d, InstanceNorm3d, PReLU,
# MaxPool3d / AvgPool3d down, ConvTranspose3d and trilinear Upsample up)

class Block3d(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv3d(cin, cout, 3, padding=1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01),
                         nn.Conv3d(cout, cout, 3, padding=1), nn.InstanceNorm3d(cout, affine=True), nn.PReLU())


class UNet3d(nn.Module):
    def __init__(self, cin=1, classes=3, widths=(8, 16, 32)):
        super().__init__()
        a, b, c = widths
        self.e1, self.e2, self.e3 = Block3d(cin, a), Block3d(a, b), Block3d(b, c)
        self.up2 = nn.ConvTranspose3d(c, b, 2, stride=2)
        self.d2 = Block3d(2 * b, b)
        self.up1 = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=False)
        self.d1 = Block3d(a + b, a)
        self.head = nn.Conv3d(a, classes, 1)

    def forward(self, x):
        s1 = self.e1(x)
        s2 = self.e2(nn.functional.max_pool3d(s1, 2))
        y = self.e3(nn.functional.avg_pool3d(s2, 2))
        y = self.d2(torch.cat([s2, self.up2(y)], dim=1))
        y = self.d1(torch.cat([s1, self.up1(y)], dim=1))
        return torch.softmax(self.head(y), dim=1)


def unet3d(out, seed):
    torch.manual_seed(seed)
    model = randomize(UNet3d(), seed)
    shape = (1, 1, 16, 64, 64)
    export(out, "unet3d", model.eval(), (image(seed, shape),), ["input"], ["probs"], seed)


# -- Recurrent nets: nn.LSTM / nn.GRU as PyTorch exports them (ONNX LSTM,
# GRU with linear_before_reset=1)

class Tagger(nn.Module):
    """A sequence tagger: embeddings, a 2-layer bidirectional LSTM, a GRU."""

    def __init__(self, vocab=100, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.lstm = nn.LSTM(32, 24, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(48, 16, batch_first=True)
        self.head = nn.Linear(16, classes)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        y, _ = self.gru(y)
        return self.head(y)


class CRNN(nn.Module):
    """A CTC text recogniser: conv features, columns as a sequence through a
    bidirectional LSTM, per-step class log-probabilities."""

    def __init__(self, classes=20):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
        self.rnn = nn.LSTM(32 * 8, 32, bidirectional=True)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        f = self.cnn(x)
        b, c, h, w = f.shape
        y, _ = self.rnn(f.permute(3, 0, 1, 2).reshape(w, b, c * h))
        return self.fc(y).log_softmax(-1)


def lstm_tagger(out, seed):
    torch.manual_seed(seed)
    model = randomize(Tagger(), seed).eval()
    export(out, "lstm_tagger", model, (ids(seed, 2, 12, 100),), ["ids"], ["logits"], seed)


def crnn(out, seed):
    torch.manual_seed(seed)
    model = randomize(CRNN(), seed).eval()
    export(out, "crnn", model, (image(seed, (2, 1, 32, 40)),), ["image"], ["log_probs"], seed)


# -- transformers ------------------------------------------------------------

def ids(seed, batch, seq, vocab):
    g = torch.Generator().manual_seed(seed + 3)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def padded_mask(batch, seq, valid):
    """An attention mask whose last sequence is padded after `valid` tokens."""
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, valid:] = 0
    return mask

class Logits(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


class Hidden(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def bert(out, seed):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=512, max_position_embeddings=128, attn_implementation="eager")
    model = randomize(BertModel(cfg), seed).eval()
    batch, seq = 2, 32
    input_ids = ids(seed, batch, seq, cfg.vocab_size)
    mask = padded_mask(batch, seq, 20)

    export(out, "bert", Hidden(model), (input_ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"], seed)


def gpt2(out, seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=4, n_head=4, use_cache=False,
                     attn_implementation="eager")
    model = randomize(GPT2LMHeadModel(cfg), seed).eval()
    batch, seq = 2, 32
    input_ids = ids(seed, batch, seq, cfg.vocab_size)
    # With an attention mask, as tokenizers give it (without one,
    # transformers traces a packed-sequence check through aten::diff,
    # which the TorchScript exporter lacks).
    mask = padded_mask(batch, seq, 24)

    export(out, "gpt2", Logits(model), (input_ids, mask), ["input_ids", "attention_mask"], ["logits"], seed)


def llama(out, seed):
    """A Llama-style decoder (rotary embeddings, RMSNorm, SwiGLU MLP,
    grouped-query attention) returning logits, without a KV cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, use_cache=False, attn_implementation="eager")
    model = randomize(LlamaForCausalLM(cfg), seed).eval()
    batch, seq = 2, 32
    input_ids = ids(seed, batch, seq, cfg.vocab_size)
    mask = padded_mask(batch, seq, 20)
    export(out, "llama", Logits(model), (input_ids, mask), ["input_ids", "attention_mask"], ["logits"], seed)


def roberta(out, seed):
    """RoBERTa: its position ids are counted from the non-padding tokens
    at run time (CumSum of a mask, then GatherElements)."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(seed)
    cfg = RobertaConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                        max_position_embeddings=130, attn_implementation="eager")
    model = randomize(RobertaModel(cfg), seed).eval()
    batch, seq = 2, 32
    input_ids = ids(seed, batch, seq, cfg.vocab_size)
    input_ids[input_ids == cfg.pad_token_id] = 5
    input_ids[1, 24:] = cfg.pad_token_id  # the second sequence is padded
    mask = (input_ids != cfg.pad_token_id).to(torch.int64)
    export(out, "roberta", Hidden(model), (input_ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"], seed)


def bart(out, seed):
    """BART (encoder and decoder): the decoder's inputs are the ids shifted
    right, an in-place slice assignment exported as ScatterND with run-time
    updates."""
    from transformers import BartConfig, BartModel

    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64,
                     attn_implementation="eager")
    model = randomize(BartModel(cfg), seed).eval()
    batch, seq = 2, 24
    input_ids = ids(seed, batch, seq, cfg.vocab_size)
    mask = padded_mask(batch, seq, 18)
    export(out, "bart", Hidden(model), (input_ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"], seed)


def pixels(out, name, model, shape, output, seed):
    """A transformers vision model taking `pixel_values`."""

    class Out(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            return getattr(self.m(pixel_values=pixel_values), output)

    export(out, name, Out(model.eval()), (image(seed, shape),), ["pixel_values"], [output], seed)


def dinov2(out, seed):
    """DINOv2: its position embeddings are interpolated bicubically to the
    patch grid (Resize mode cubic on a constant)."""
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(seed)
    cfg = Dinov2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=112,
                       patch_size=14, attn_implementation="eager")
    pixels(out, "dinov2", randomize(Dinov2Model(cfg), seed), (1, 3, 98, 126), "pooler_output", seed)


def t5_encoder(out, seed):
    """T5's encoder: relative position buckets (log-spaced, computed from
    the positions at run time), RMS-style T5LayerNorm, gated-free ReLU FFN."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=500, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    model = randomize(T5EncoderModel(cfg), seed).eval()
    input_ids = ids(seed, 2, 32, cfg.vocab_size)
    export(out, "t5_encoder", Hidden(model), (input_ids, padded_mask(2, 32, 20)), ["input_ids", "attention_mask"], ["last_hidden_state"], seed)


def qwen2(out, seed):
    """A Qwen2 decoder (grouped-query attention with biased q/k/v, RoPE,
    RMSNorm, SwiGLU) returning logits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, use_cache=False, attn_implementation="eager")
    model = randomize(Qwen2ForCausalLM(cfg), seed).eval()
    export(out, "qwen2", Logits(model), (ids(seed, 2, 32, cfg.vocab_size), padded_mask(2, 32, 20)),
           ["input_ids", "attention_mask"], ["logits"], seed)


def wav2vec2(out, seed):
    """wav2vec 2.0 on raw audio: a strided 1-D conv feature encoder with
    GroupNorm, a grouped positional convolution, a transformer encoder."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    torch.manual_seed(seed)
    cfg = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    model = randomize(Wav2Vec2Model(cfg), seed).eval()

    class Out(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_values):
            return self.m(input_values=input_values).last_hidden_state

    audio = torch.randn(1, 4000, generator=torch.Generator().manual_seed(seed))
    export(out, "wav2vec2", Out(model), (audio,), ["input_values"], ["last_hidden_state"], seed)


def segformer(out, seed):
    """SegFormer: overlapping patch embeddings, efficient (spatially
    reduced) attention, Mix-FFN with a depthwise conv, an all-MLP decoder."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    torch.manual_seed(seed)
    model = randomize(SegformerForSemanticSegmentation(SegformerConfig(num_labels=5)), seed)
    pixels(out, "segformer", model, (1, 3, 64, 64), "logits", seed)


def detr(out, seed):
    """DETR (ResNet backbone, transformer encoder-decoder, box head); its
    encoder checks activations with IsNaN/IsInf at run time."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(seed)
    backbone = ResNetConfig(hidden_sizes=[32, 64, 128, 256], embedding_size=32, depths=[1, 1, 1, 1], out_features=["stage4"])
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=128,
                     encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_dim=256, decoder_ffn_dim=256, num_queries=20)
    model = randomize(DetrForObjectDetection(cfg), seed)
    calibrate_bn(model, (2, 3, 160, 160), seed, passes=1)
    pixels(out, "detr", model, (1, 3, 160, 160), "pred_boxes", seed)




# -- ultralytics ---------------------------------------------------------------

def ultralytics_model(out, name, config, size, seed):
    """A YOLO from ultralytics' bundled config (no weights, no network),
    exported by its own `model.export` (into the working directory)."""
    os.environ["YOLO_OFFLINE"] = "1"
    from ultralytics import YOLO

    torch.manual_seed(seed)
    yolo = YOLO(config)
    randomize(yolo.model, seed)
    calibrate_bn(yolo.model, (2, 3, size, size), seed, passes=1)
    x = image(seed, (1, 3, size, size))
    truth = float64_output(yolo.model.eval(), (x,))
    t0 = time.time()
    path = yolo.export(format="onnx", opset=OPSET, simplify=False, imgsz=size, dynamic=False, verbose=False)
    t = time.time() - t0
    dest = os.path.join(out, f"{name}.onnx")
    os.replace(os.path.join(out, path), dest)
    input_name = onnx.load(dest, load_external_data=False).graph.input[0].name
    save(out, name, dest, {input_name: x.numpy()}, t, truth)


MODELS = {
    "resnet50": lambda out: torchvision_model(out, "resnet50", __import__("torchvision").models.resnet50, (1, 3, 224, 224), 50),
    "mobilenet_v3_small": lambda out: torchvision_model(
        out, "mobilenet_v3_small", __import__("torchvision").models.mobilenet_v3_small, (1, 3, 224, 224), 31),
    "efficientnet_b0": lambda out: torchvision_model(
        out, "efficientnet_b0", __import__("torchvision").models.efficientnet_b0, (1, 3, 224, 224), 70),
    "deeplabv3": lambda out: torchvision_model(
        out, "deeplabv3", __import__("torchvision").models.segmentation.deeplabv3_resnet50, (1, 3, 256, 256), 33,
        output="out", weights_backbone=None, num_classes=21, aux_loss=False),
    "swin_v2_t": lambda out: torchvision_model(out, "swin_v2_t", __import__("torchvision").models.swin_v2_t, (1, 3, 256, 256), 41),
    "maxvit_t": lambda out: torchvision_model(out, "maxvit_t", __import__("torchvision").models.maxvit_t, (1, 3, 224, 224), 43),
    # Branches concatenated (Inception blocks, dense blocks), channels-last
    # LayerNorm with 7x7 depthwise convs, grouped convs with squeeze-excite,
    # channel shuffles.
    "googlenet": lambda out: torchvision_model(
        out, "googlenet", __import__("torchvision").models.googlenet, (1, 3, 224, 224), 14, aux_logits=False, init_weights=True),
    "densenet121": lambda out: torchvision_model(out, "densenet121", __import__("torchvision").models.densenet121, (1, 3, 224, 224), 15),
    "convnext_tiny": lambda out: torchvision_model(out, "convnext_tiny", __import__("torchvision").models.convnext_tiny, (1, 3, 224, 224), 16),
    "regnet_y_400mf": lambda out: torchvision_model(out, "regnet_y_400mf", __import__("torchvision").models.regnet_y_400mf, (1, 3, 224, 224), 17),
    "shufflenet_v2": lambda out: torchvision_model(
        out, "shufflenet_v2", __import__("torchvision").models.shufflenet_v2_x1_0, (1, 3, 224, 224), 18),
    # Video: 3-D convolutions over an 8-frame 112x112 clip.
    "mc3_18": lambda out: torchvision_model(out, "mc3_18", __import__("torchvision").models.video.mc3_18, (1, 3, 8, 112, 112), 19),
    # Optical flow: GridSample on a run-time grid.
    "raft_small": lambda out: raft_small(out, 27),
    "unet": lambda out: unet(out, 12),
    "unet3d": lambda out: unet3d(out, 20),
    "lstm_tagger": lambda out: lstm_tagger(out, 21),
    "crnn": lambda out: crnn(out, 22),
    "bert": lambda out: bert(out, 7),
    "gpt2": lambda out: gpt2(out, 2),
    "llama": lambda out: llama(out, 4),
    "roberta": lambda out: roberta(out, 6),
    "bart": lambda out: bart(out, 9),
    "dinov2": lambda out: dinov2(out, 10),
    "detr": lambda out: detr(out, 11),
    "t5_encoder": lambda out: t5_encoder(out, 23),
    "qwen2": lambda out: qwen2(out, 24),
    "wav2vec2": lambda out: wav2vec2(out, 25),
    "segformer": lambda out: segformer(out, 26),
    "yolov8n": lambda out: ultralytics_model(out, "yolov8n", "yolov8n.yaml", 640, 8),
    "yolo11n": lambda out: ultralytics_model(out, "yolo11n", "yolo11n.yaml", 320, 13),
}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    names = sys.argv[2:] or list(MODELS)
    torch.set_num_threads(2)
    cwd = os.getcwd()
    os.chdir(out)  # ultralytics writes next to the working directory
    try:
        for n in names:
            MODELS[n](out)
    finally:
        os.chdir(cwd)


if __name__ == "__main__":
    main()
