"""The models of hybrid_train's models/ written the way a PyTorch user would write them.

Same architecture, initialization and defaults as the C++ side (models/convnet.cpp,
models/resnet.cpp, models/decoder.cpp with GPT-2's layout), so that a training step does the same arithmetic.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvNet(nn.Module):
    """conv-BN-ReLU-pool per entry of `channels`, then fc-ReLU-dropout-fc. (B,1,28,28) -> (B,10)"""

    def __init__(self, channels=(32, 64), fc_hidden=128, classes=10, dropout=0.25, in_channels=1, size=28):
        super().__init__()
        blocks = []
        for c in channels:
            blocks += [nn.Conv2d(in_channels, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2)]
            in_channels, size = c, size // 2
        self.features = nn.Sequential(*blocks)
        self.fc1 = nn.Linear(in_channels * size * size, fc_hidden)
        self.fc2 = nn.Linear(fc_hidden, classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = F.relu(self.fc1(self.features(x).flatten(1)))
        return self.fc2(self.dropout(h))


def _conv(cin, cout, k, stride):
    c = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
    nn.init.kaiming_normal_(c.weight, mode="fan_out", nonlinearity="relu")
    return c


class BasicBlock(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, planes, 3, stride), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, 1), nn.BatchNorm2d(planes)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(_conv(cin, planes, 1, stride), nn.BatchNorm2d(planes))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with the small-input stem (3x3 stride 1, no max pool). (B,3,H,W) -> (B,classes)"""

    def __init__(self, classes=10, width=64, in_channels=3):
        super().__init__()
        self.stem = nn.Sequential(_conv(in_channels, width, 3, 1), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for stage in range(4):
            planes = width << stage
            for i in range(2):
                layers.append(BasicBlock(cin, planes, 2 if stage > 0 and i == 0 else 1))
                cin = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


class Bottleneck(nn.Module):
    """models/resnet.cpp's: conv1x1, conv3x3(stride), conv1x1(x4), each with bn, + shortcut."""

    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, planes, 1, 1), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = _conv(planes, 4 * planes, 1, 1), nn.BatchNorm2d(4 * planes)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != 4 * planes:
            self.shortcut = nn.Sequential(_conv(cin, 4 * planes, 1, stride), nn.BatchNorm2d(4 * planes))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.relu(self.bn3(self.conv3(h)) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 with the ImageNet stem (7x7 stride 2, max pool), models/resnet.cpp's with
    small_input = false. `blocks` lists the stem, every residual block and the head, the units a
    user checkpoints. (B,3,H,W) -> (B,classes)"""

    def __init__(self, classes=1000, width=64, in_channels=3):
        super().__init__()
        stem = nn.Sequential(_conv(in_channels, width, 7, 2), nn.BatchNorm2d(width), nn.ReLU(),
                             nn.MaxPool2d(3, 2, 1))
        blocks, cin = [stem], width
        for stage, count in enumerate((3, 4, 6, 3)):
            planes = width << stage
            for i in range(count):
                blocks.append(Bottleneck(cin, planes, 2 if stage > 0 and i == 0 else 1))
                cin = 4 * planes
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)

    def head(self, x):
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.dropout = heads, dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.x: what a user writes today
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # PyTorch 1.13 (Debian's): the T x T scores, as nanoGPT wrote it then
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = F.dropout(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1), p, self.training)
            y = att @ v
        y = y.transpose(1, 2).reshape(b, t, d)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads, dropout)
        self.ln2, self.fc, self.proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.dropout = dropout

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + F.dropout(self.proj(F.gelu(self.fc(self.ln2(h)), approximate="tanh")), self.dropout, self.training)


class Gpt(nn.Module):
    """Pre-LN decoder with a tied head, GPT-2 initialization. idx (B,T) -> logits (B,T,V)"""

    def __init__(self, vocab, block_size, n_layer, n_head, n_embd, dropout):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f, self.dropout = nn.LayerNorm(n_embd), dropout
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln" not in name:
                nn.init.zeros_(p)
        for blk in self.blocks:
            for w in (blk.attn.c_proj.weight, blk.proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)
