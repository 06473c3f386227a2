"""The speaker encoder: shapes and unit-length embeddings for every trunk, the reversible stages'
gradients against plain autograd, activation memory flat in depth, and the AAM head's margin."""

from __future__ import annotations

import pytest
import torch

from chorus.models.reversible import couple
from chorus.models.speaker_encoder import (
    AdditiveAngularMargin,
    SpeakerEncoder,
    SpeakerEncoderConfig,
    Stage,
)
from test_efficiency import grads, saved_bytes

SMALL = dict(channels=(8, 8, 16, 16), embedding_dim=16, n_mels=16, groups=2, pooling_hidden=8)


@pytest.mark.parametrize("arch,depth", [("resnet", 10), ("resnet", 18), ("df-resnet", 56)])
@pytest.mark.parametrize("reversible", [False, True])
def test_embeddings_are_unit_vectors_for_any_length(arch, depth, reversible):
    torch.manual_seed(0)
    encoder = SpeakerEncoder(SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible, **SMALL)).eval()
    for frames in (40, 57):
        embedding = encoder(torch.randn(3, frames, 16))
        assert embedding.shape == (3, 16)
        torch.testing.assert_close(embedding.norm(dim=-1), torch.ones(3))


@pytest.mark.parametrize("arch", ["resnet", "df-resnet"])
def test_reversible_stage_gradients_equal_plain_autograd(arch):
    torch.manual_seed(0)
    stage = Stage(arch, 4, 8, blocks=3, stride=2, groups=2, rev=True).double()
    x = torch.randn(2, 4, 16, 20, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 8, 8, 10, dtype=torch.float64)
    (stage(x) * weight).sum().backward()
    ours, ours_x = grads(stage), x.grad.clone()
    stage.zero_grad(set_to_none=True)
    x.grad = None
    h = stage.transition(x)
    reference = torch.cat(couple(tuple(stage.blocks), *h.chunk(2, dim=1)), dim=1)  # plain autograd
    (reference * weight).sum().backward()
    assert ours.keys() == grads(stage).keys()
    for name, grad in grads(stage).items():
        torch.testing.assert_close(ours[name], grad, msg=name)
    torch.testing.assert_close(ours_x, x.grad)


def test_reversible_activation_memory_does_not_grow_with_depth():
    mel = torch.randn(2, 48, 16)

    def trunk_bytes(reversible: bool, arch: str, depth: int) -> int:
        torch.manual_seed(0)
        encoder = SpeakerEncoder(SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible, **SMALL))
        return saved_bytes(lambda: encoder(mel))[0]

    for arch, depths in (("resnet", (10, 18, 34)), ("df-resnet", (56, 110))):
        reversible = [trunk_bytes(True, arch, d) for d in depths]
        plain = [trunk_bytes(False, arch, d) for d in depths]
        assert len(set(reversible)) == 1, (arch, reversible)  # flat: only stage outputs and transitions
        assert plain == sorted(plain) and plain[0] < plain[-1], (arch, plain)
        assert reversible[-1] < plain[-1] / 2, (arch, reversible, plain)


def test_aam_head_penalizes_the_true_class_by_its_margin():
    head = AdditiveAngularMargin(4, 3, margin=0.3, scale=10.0)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3, 4))
    embedding = torch.nn.functional.normalize(torch.tensor([[1.0, 0.5, 0.0, 0.0]]), dim=-1)
    plain = head.logits(embedding)
    margined = head.logits(embedding, torch.tensor([0]))
    theta = torch.acos(plain[0, 0] / 10.0)
    torch.testing.assert_close(margined[0, 0], 10.0 * torch.cos(theta + 0.3))
    torch.testing.assert_close(margined[0, 1:], plain[0, 1:])
    assert head(embedding, torch.tensor([0])) > torch.nn.functional.cross_entropy(plain, torch.tensor([0]))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="depth 19 is not one of 10, 18, 34, 50"):
        SpeakerEncoderConfig(depth=19)
    with pytest.raises(ValueError, match="unknown speaker encoder arch"):
        SpeakerEncoderConfig(arch="tdnn")
    with pytest.raises(ValueError, match="multiple of 2 x groups"):
        SpeakerEncoderConfig(channels=(8, 8, 16, 18), groups=2)
    config = SpeakerEncoderConfig(**SMALL)
    assert SpeakerEncoderConfig.from_dict(config.to_dict()) == config
