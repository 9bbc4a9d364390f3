"""A real PyTorch model behind Triton's dynamic batcher: a small convolutional image classifier
(random weights from a seed, nothing downloaded) bound with ``gpu_arrays="torch"``.

On a machine with a CUDA GPU the model runs there (a ``KIND_GPU`` instance; the image input is
declared ``device="gpu"``, so a host image is placed on the GPU before the call and a torch CUDA
tensor from the caller reaches the callable as it is); elsewhere it runs on the CPU. Requests
from several threads are batched by Triton into one forward pass, and the answers are the same
as the module's own on each image alone.

    python examples/torch_model.py

Needs torch (``pip install torch``); says so and exits 0 without it. ``build_model`` is what
benchmarks/bench_torch.py serves three ways (the module called directly, this binding, and
Triton's python backend), so the module imports nothing of embedtriton at the top.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

IMAGE = (3, 64, 64)  # channels, height, width
CLASSES = 10


def build_model(seed: int = 0):
    """The classifier: three 3x3 convolutions (32, 64, 128 channels; the last two with stride 2)
    with batch norm and ReLU, global average pooling and a linear layer to CLASSES logits, in
    eval mode, its weights drawn from ``seed``."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)

    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(IMAGE[0], 32, 1),
        *block(32, 64, 2),
        *block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, CLASSES),
    )
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):  # He-scaled weights
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * (2.0 / fan_in) ** 0.5)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.1)
            elif isinstance(module, nn.BatchNorm2d):  # statistics as if from training
                n = module.num_features
                module.weight.copy_(1 + 0.1 * torch.randn(n, generator=generator))
                module.bias.copy_(0.1 * torch.randn(n, generator=generator))
                module.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))
    return model.eval()


def bind(server, name: str = "classifier", max_batch_size: int = 32, device: str | None = None) -> str:
    """Bind the classifier to ``server`` as model ``name`` (dynamic batcher up to
    ``max_batch_size`` images: what queues while a batch runs goes in the next). Returns the
    device it runs on."""
    import torch

    from embedtriton import DynamicBatcher, InstanceGroup, ModelConfig, Tensor, batch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model().to(device)
    # a one-request batch's host input is a read-only view of the request's memory: torch warns
    # that it cannot mark a tensor read-only, and the model only reads it
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")

    @batch
    def classify(image):
        # a torch tensor on the GPU (gpu_arrays="torch"), or a numpy array on the CPU
        with torch.inference_mode():
            logits = model(torch.as_tensor(image, device=device))
        return {"logits": logits, "label": logits.argmax(1, keepdim=True)}

    server.bind(
        name,
        classify,
        [Tensor(name="image", dtype=np.float32, shape=IMAGE, device="gpu" if device != "cpu" else "cpu")],
        [Tensor(name="logits", dtype=np.float32, shape=(CLASSES,)), Tensor(name="label", dtype=np.int64, shape=(1,))],
        ModelConfig(
            max_batch_size=max_batch_size,
            batcher=DynamicBatcher(max_queue_delay_microseconds=0),
            gpu_arrays="torch",
            instance_group=[InstanceGroup(kind="GPU", gpus=[torch.device(device).index or 0])]
            if device != "cpu"
            else None,
        ),
    )
    return device


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"this example needs torch: {exc}")
        return 0
    from concurrent.futures import ThreadPoolExecutor

    from embedtriton import Server

    server = Server()
    device = bind(server)
    reference = build_model().to(device)
    images = np.random.default_rng(0).standard_normal((16, *IMAGE), dtype=np.float32)
    with server:
        model = server.model("classifier")
        # one image per request, from 16 threads at once: Triton batches them
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda image: model.infer({"image": image[None]}), images))
        with torch.inference_mode():
            expected = reference(torch.as_tensor(images, device=device)).cpu().numpy()
        logits = np.concatenate([a["logits"] for a in answers])
        labels = [int(a["label"][0, 0]) for a in answers]
        assert np.allclose(logits, expected, atol=1e-4), "the served model disagrees with the module"
        stats = model.statistics()
        print(f"device: {device}")
        print(f"labels: {labels}")
        print(
            f"16 requests in {stats['execution_count']} executions "
            f"(the module's own logits, max difference {np.abs(logits - expected).max():.1e})"
        )
        if device != "cpu":  # a torch CUDA tensor in, the logits back in GPU memory
            out = model.infer({"image": torch.as_tensor(images[:1], device=device)}, output_device="gpu")
            print(f"a CUDA tensor in, logits on the GPU: {torch.from_dlpack(out['logits']).device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
