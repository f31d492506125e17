"""The chat template a policy's prompts use: a vision-language policy's renders image parts.

Training (runtime/factories.py re-exports it), evaluation of a checkpoint (eval/checkpoint_policy.py) and
serving all render prompts with the template this gives, so the three agree on the tokens of an image turn.
"""

from __future__ import annotations

from typing import Any


def policy_template(template: Any, vl_config: Any) -> Any:
    """The run's chat template for its policy: with a vision-language model (``vl_config``, its
    Qwen3VLConfig; None for a text model) the byte template renders image parts (``ByteVLChatTemplate``) and
    the Qwen chat template renders them as Qwen3-VL's official template does (``QwenVLChatTemplate``); any
    other pairing is returned as is."""
    from rz_agents.model.chat_template import ChatTemplate
    from rz_agents.rollout.byte_chat import ByteChatTemplate

    if vl_config is not None and type(template) is ByteChatTemplate:
        from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate

        return ByteVLChatTemplate(vl_config)
    if vl_config is not None and type(template) is ChatTemplate:
        from rz_agents.rollout.qwen_vl_chat import QwenVLChatTemplate

        return QwenVLChatTemplate.of(template, vl_config)
    return template
