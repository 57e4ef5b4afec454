"""Models for the bundled training script: ResNet-50 and a tiny CNN for fast tests.

The bundled ResNet-50 is torchvision's ``resnet50`` layer for layer (same module
names, same initialisation, 25,557,032 parameters with 1000 classes), so a job runs
on hosts where torchvision is missing or built for another torch/CUDA, and its
checkpoints load into torchvision's model and back.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

import torch
from torch import nn

logger = logging.getLogger(__name__)

MODEL_NAMES = ("resnet50", "tiny")
RESNET50_LAYERS = (3, 4, 6, 3)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: the stride sits on the 3x3 convolution, as in torchvision."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ImageNet ResNet built from Bottleneck blocks; module names match torchvision's."""

    def __init__(self, layers: tuple[int, ...], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        self._init_weights()

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class TinyBlock(nn.Sequential):
    """conv3x3 + BatchNorm + ReLU: the unit TinyNet is built from (and FSDP shards)."""

    def __init__(self, in_planes: int, out_planes: int, stride: int) -> None:
        super().__init__(conv3x3(in_planes, out_planes, stride), nn.BatchNorm2d(out_planes), nn.ReLU(inplace=True))


class TinyNet(nn.Sequential):
    """Three conv blocks and a classifier: the same code path as ResNet-50 in a second."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(
            TinyBlock(3, 16, stride=2),
            TinyBlock(16, 32, stride=2),
            TinyBlock(32, 64, stride=2),
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(64, num_classes),
        )


def build_resnet50(num_classes: int = 1000) -> ResNet:
    """The bundled ResNet-50 (Bottleneck blocks [3, 4, 6, 3])."""
    return ResNet(RESNET50_LAYERS, num_classes)


@functools.cache
def torchvision_models() -> ModuleType | None:
    """``torchvision.models`` when torchvision imports on this host, else None.

    A torchvision wheel built for another torch or CUDA version fails at import time
    with ImportError, OSError or RuntimeError depending on what is missing, so any
    exception means "not usable here"; only that case is logged, not a torchvision that
    is simply not installed (the bundled copy is then the model, as its own line says).
    """
    try:
        return importlib.import_module("torchvision.models")
    except Exception as exc:
        if not isinstance(exc, ModuleNotFoundError):  # not installed is no news: the bundled copy serves
            logger.info("torchvision is installed but does not import here (%s: %s)", type(exc).__name__, exc)
        return None


def build_model(name: str, num_classes: int = 1000) -> nn.Module:
    """Build ``resnet50`` (torchvision's when it imports, else the bundled copy) or ``tiny``.

    Raises:
        ValueError: ``name`` is not one of MODEL_NAMES.
    """
    if name == "tiny":
        logger.info("model tiny: bundled TinyNet")
        return TinyNet(num_classes)
    if name != "resnet50":
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    models = torchvision_models()
    if models is None:
        logger.info("model resnet50: bundled implementation (jobs/resnet_model.py)")
        return build_resnet50(num_classes)
    logger.info("model resnet50: torchvision implementation")
    return models.resnet50(weights=None, num_classes=num_classes)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP wraps one by one before the root: ResNet Bottlenecks or TinyBlocks."""
    block_types: tuple[type[nn.Module], ...] = (Bottleneck, TinyBlock)
    models = torchvision_models()
    if models is not None:
        block_types += (models.resnet.Bottleneck,)
    return [module for module in model.modules() if isinstance(module, block_types)]
