"""One sampling distribution for engine and learner: what the engine is asked for is what the learner
scores under."""

import pytest

from rz_agents.engine.params import SamplingParams
from rz_agents.sampling import SamplingSpec


def test_engine_requests_and_learner_scoring_name_the_same_distribution():
    spec = SamplingSpec(temperature=0.7, top_k=5, top_p=0.9)
    params = SamplingParams.from_spec(spec, max_tokens=12, seed=3)
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 5, 0.9)
    assert (params.max_tokens, params.seed) == (12, 3)
    assert spec.scoring() == {"temperature": 0.7, "top_k": 5, "top_p": 0.9}


@pytest.mark.parametrize(
    "kw, field", [(dict(temperature=-1.0), "rollout.temperature"), (dict(top_k=-2), "rollout.top_k"),
                  (dict(top_p=0.0), "rollout.top_p"),
                  (dict(temperature=float("nan")), "rollout.temperature")],
)  # fmt: skip
def test_a_bad_value_names_the_rollout_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingSpec(**kw)
