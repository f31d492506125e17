"""Kimi's chat and tool-call control tokens (Kimi K2 / Kimi Linear tokenizers), shared by the chat template
that writes them (`rz_agents.model.kimi_chat`) and the tool-call parser that reads them
(`rz_agents.envs.kimi_tool_calls`). Source: Kimi K2 Instruct's jinja chat_template."""

IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
IM_END = "<|im_end|>"
EOS = "[EOS]"
TOOL_CALLS_SECTION_BEGIN = "<|tool_calls_section_begin|>"
TOOL_CALLS_SECTION_END = "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_CALL_ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
# A call's id as the model writes it: functions.{name}:{index of the call in the conversation}
CALL_ID_PREFIX = "functions."
