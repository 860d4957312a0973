"""The model classes a GPT ``.nemo`` names as its ``target``, and NeMo-Aligner's reward head.

NeMo writes the model class into ``model_config.yaml`` as ``target`` (``modelPT.py`` lines
123-126); a model trained by NeMo's SFT or by NeMo-Aligner keeps that trainer's class, though
its weights are a plain ``MegatronGPTModel``'s. :data:`GPT_TARGET_ALIASES` maps each such
class to ``MegatronGPTModel`` — one table, so that the family the config describes is chosen
as for any GPT ``.nemo``. Classes, file:line (NeMo @ 8cfedd7203, NeMo-Aligner @ af2b3bd9):

* NeMo ``nemo/collections/nlp/models/language_modeling/megatron_gpt_sft_model.py:85``
  ``MegatronGPTSFTModel(MegatronGPTModel)``;
* NeMo-Aligner ``nemo_aligner/models/nlp/gpt/``, each a ``MegatronGPTModel`` subclass:
  ``gpt_sft_model.py:49`` ``GPTSFTModel``, ``gpt_steerlm_model.py:53`` ``GPTSteerLMModel``,
  ``megatron_gpt_dpo_model.py:47`` ``MegatronGPTDPOModel`` (DPO, IPO and the RPO losses are
  its ``preference_loss``, lines 356-392), ``megatron_gpt_kto_model.py:46``
  ``MegatronGPTKTOModel``, ``megatron_gpt_spin_model.py:51`` ``MegatronGPTSPINModel``,
  ``megatron_gpt_ppo_actor.py:64`` ``MegatronGPTActorModel``,
  ``megatron_gpt_reinforce_actor.py:64`` ``MegatronGPTReinforceActorModel``,
  ``megatron_gpt_rs_actor.py:53`` ``MegatronGPTRSModel``,
  ``megatron_gpt_knowledge_distillation.py:44`` ``GPTKnowledgeDistillationModel``;
  and the reward models (:data:`REWARD_TARGETS`): ``megatron_gpt_reward_model.py:51``
  ``MegatronGPTRewardModel``, ``megatron_gpt_regression_reward_model.py:32``
  ``MegatronGPTRegressionRewardModel``, ``megatron_gpt_critic.py:46`` ``MegatronGPTCriticModel``.

A reward model is the GPT model plus ``rm_head`` (``gpt_reward_model.py`` lines 30-70 and
190-201): a ``RowParallelLinear(hidden, num_attributes, bias=True)`` applied to the final
(normed) hidden state of the last token (or their mean, ``use_avg_pool``; every position for
the critic, ``output_sequence``). The model still builds Megatron-Core's ``output_layer``,
always untied (``megatron_gpt_reward_model.py`` lines 87-91 override
``share_embeddings_and_output_weights`` to False), so the language model is complete without
the head.
"""

from __future__ import annotations

from typing import Any

from nemo_convert.tensors.base import TensorSource
from nemo_convert.tensors.views import RenamedView

GPT_TARGET = "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel"
_ALIGNER = "nemo_aligner.models.nlp.gpt."
#: NeMo-Aligner's reward-model classes (their weights add :data:`REWARD_HEAD`).
REWARD_TARGETS = (
    _ALIGNER + "megatron_gpt_reward_model.MegatronGPTRewardModel",
    _ALIGNER + "megatron_gpt_regression_reward_model.MegatronGPTRegressionRewardModel",
    _ALIGNER + "megatron_gpt_critic.MegatronGPTCriticModel",
)
#: Trainer classes whose weights are a ``MegatronGPTModel``'s → that class.
GPT_TARGET_ALIASES: dict[str, str] = {
    "nemo.collections.nlp.models.language_modeling.megatron_gpt_sft_model.MegatronGPTSFTModel": GPT_TARGET,
    **{_ALIGNER + name: GPT_TARGET for name in (
        "gpt_sft_model.GPTSFTModel", "gpt_steerlm_model.GPTSteerLMModel", "megatron_gpt_dpo_model.MegatronGPTDPOModel",
        "megatron_gpt_kto_model.MegatronGPTKTOModel", "megatron_gpt_spin_model.MegatronGPTSPINModel",
        "megatron_gpt_ppo_actor.MegatronGPTActorModel", "megatron_gpt_reinforce_actor.MegatronGPTReinforceActorModel",
        "megatron_gpt_rs_actor.MegatronGPTRSModel",
        "megatron_gpt_knowledge_distillation.GPTKnowledgeDistillationModel")},
    **{t: GPT_TARGET for t in REWARD_TARGETS},
}
#: NeMo-Aligner's reward head (logical names).
REWARD_HEAD = ("rm_head.weight", "rm_head.bias")


def canonical_target(target: Any) -> Any:
    """The model class whose weights ``target``'s are (itself when not an alias)."""
    return GPT_TARGET_ALIASES.get(target, target) if isinstance(target, str) else target


def reward_model_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A reward model's config as the model was built: never tied (lines 87-91)."""
    if cfg.get("target") in REWARD_TARGETS and cfg.get("share_embeddings_and_output_weights"):
        return ({**cfg, "share_embeddings_and_output_weights": False},
                ["share_embeddings_and_output_weights read as false: NeMo-Aligner's reward models always build "
                 "an untied output layer (megatron_gpt_reward_model.py)"])
    return cfg, []


def head_names(source: TensorSource) -> list[str]:
    """The reward-head tensors ``source`` holds."""
    keys = set(source.keys())
    return [k for k in REWARD_HEAD if k in keys]


def without(source: TensorSource, names: list[str]) -> TensorSource:
    """``source`` less the tensors ``names``."""
    gone = set(names)
    return RenamedView(source, {k: k for k in source.keys() if k not in gone})
