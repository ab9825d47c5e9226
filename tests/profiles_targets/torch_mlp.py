"""A small PyTorch MLP on the CPU, its forward pass run in a loop (one intra-op thread)."""

import torch
from torch import nn

torch.set_num_threads(1)


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.fc2 = nn.Linear(1024, 512)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def infer_loop(model, batch):
    with torch.no_grad():
        while True:
            model(batch)


model = TinyMLP().eval()
batch = torch.randn(64, 512)
model(batch)
print("ready", flush=True)
infer_loop(model, batch)
