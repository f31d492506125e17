"""DeepSeek's control tokens (fullwidth bars U+FF5C, U+2581 for spaces), shared by the chat template that
writes them (`rz_agents.model.deepseek_chat`) and the tool-call parser that reads them
(`rz_agents.envs.deepseek_tool_calls`). Source: DeepSeek-V3.1's tokenizer_config.json and chat_template."""

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
TOOL_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
TOOL_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
TOOL_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
TOOL_SEP = "<\uff5ctool\u2581sep\uff5c>"
TOOL_OUTPUT_BEGIN = "<\uff5ctool\u2581output\u2581begin\uff5c>"
TOOL_OUTPUT_END = "<\uff5ctool\u2581output\u2581end\uff5c>"

# DeepSeek-V3.2 / V4 (their published ``encoding/encoding_dsv32.py`` and ``encoding_dsv4.py``): tool calls
# are DSML elements, ``<｜DSML｜invoke name="...">`` holding
# ``<｜DSML｜parameter name="..." string="true|false">``.
DSML = "\uff5cDSML\uff5c"
DSML_INVOKE_OPEN = f"<{DSML}invoke"
DSML_INVOKE_CLOSE = f"</{DSML}invoke>"
DSML_PARAMETER_OPEN = f"<{DSML}parameter"
DSML_PARAMETER_CLOSE = f"</{DSML}parameter>"
DSML_CALLS_BLOCK = {"v3.2": "function_calls", "v4": "tool_calls"}  # the block's element name per version
