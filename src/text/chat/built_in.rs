//! llama.cpp's built-in chat templates, by name.

/// llama.cpp's built-in templates that a name selects instead of the
/// model's own (`--chat-template NAME`, the Python package's `chat_format`),
/// as Jinja: ChatML, Llama 2's, Llama 3's and Command R's turns.
pub const BUILT_IN: [(&str, &str); 4] =
    [("chatml", CHATML), ("llama2", LLAMA2), ("llama3", LLAMA3), ("command-r", COMMAND_R)];

/// Llama 2's turns (`--chat-template llama2`): a system message folded into
/// the first user turn between `<<SYS>>` markers, each user turn in
/// `[INST] ... [/INST]`, each answer closed by the end-of-sequence token.
const LLAMA2: &str = "{% if messages[0]['role'] == 'system' %}{% set system = '<<SYS>>\n' + messages[0]['content'] | trim + '\n<</SYS>>\n\n' %}{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}{% for message in turns %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] | trim + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}";

/// Llama 3's turns (`--chat-template llama3`), each message's text trimmed, as llama.cpp writes them.
const LLAMA3: &str = "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Command R's turns (`--chat-template command-r`), as llama.cpp writes them.
const COMMAND_R: &str = "{% for message in messages %}{% set token = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>'}.get(message['role'], '<|CHATBOT_TOKEN|>') %}{{ '<|START_OF_TURN_TOKEN|>' + token + message['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}";

/// ChatML, the template `--chat-template chatml` names.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The Jinja source of the built-in template `name`, if there is one.
pub fn built_in(name: &str) -> Option<&'static str> {
    BUILT_IN.iter().find(|(n, _)| *n == name).map(|(_, source)| *source)
}
