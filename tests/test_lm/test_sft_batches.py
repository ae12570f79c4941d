"""SFT minibatches: every demo once per pass, no duplicates within a batch, the full batch when asked."""

import numpy as np

from echo_rl.lm.sft import sft_batches


def test_full_batch_every_step():
    demos = list(range(5))
    assert list(sft_batches(demos, 3, 0, np.random.default_rng(0))) == [demos] * 3
    assert list(sft_batches(demos, 2, 9, np.random.default_rng(0))) == [demos] * 2


def test_minibatches_cover_each_pass_without_duplicates():
    demos = list(range(10))
    batches = list(sft_batches(demos, 6, 3, np.random.default_rng(1)))
    assert len(batches) == 6 and all(len(b) == 3 and len(set(b)) == 3 for b in batches)
    # 3 batches per pass of 10 (one left over waits): each pass's batches are disjoint
    for start in (0, 3):
        seen = [d for b in batches[start:start + 3] for d in b]
        assert len(set(seen)) == 9
    assert batches[:3] != batches[3:]  # reshuffled between passes
