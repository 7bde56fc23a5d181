//! llama.cpp's built-in chat templates, by name.

use crate::error::{Error, Result};

/// llama.cpp's built-in templates that a name selects instead of the
/// model's own (`--chat-template NAME`, the Python package's `chat_format`),
/// as Jinja: ChatML, Llama 2's, Llama 3's and Command R's turns.
const BUILT_IN: [(&str, &str); 4] =
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

/// The built-in templates' names, comma-separated, for the messages that list them.
pub fn built_in_names() -> String {
    BUILT_IN.map(|(name, _)| name).join(", ")
}

/// The built-in template's source that llama.cpp renders `source` as when
/// Jinja is off (llama-server's `--no-jinja`: the template it detects by
/// `llm_chat_detect_template`'s markers), or an error naming the flag when
/// it renders none of them.
pub fn without_jinja(source: &str) -> Result<&'static str> {
    detect_built_in(source).and_then(built_in).ok_or_else(|| {
        Error::Template(format!(
            "--no-jinja: the chat template is none of the built-in templates ({}) that llama.cpp renders \
             without Jinja; drop --no-jinja to render it as Jinja",
            built_in_names()
        ))
    })
}

/// The markers of templates llama.cpp detects before Command R's and Llama
/// 3's (Phi-3, GLM, Zephyr, Gemma, Orca, OpenChat, Vicuna, DeepSeek Coder
/// and others), each a set that must all be present.
const OTHERS_FIRST: [&[&str]; 11] = [
    &["<|assistant|>", "<|end|>"],
    &["[gMASK]<sop>"],
    &["<|assistant|>", "<|user|>"],
    &["<|{{ item['role'] }}|>", "<|begin_of_image|>"],
    &["<|user|>", "<|endoftext|>"],
    &["bos_token + message['role']"],
    &["<start_of_turn>"],
    &["'\\n\\nAssistant: ' + eos_token"],
    &["GPT4 Correct "],
    &["USER: ", "ASSISTANT: "],
    &["### Instruction:", "<|EOT|>"],
];

/// The built-in template llama.cpp renders a chat template as when Jinja is
/// off (llama-server's `--no-jinja`): a built-in name as itself, else what
/// the source's markers say (`llm_chat_detect_template`'s rules for the
/// templates here). `None`: none of these, or a variant llama.cpp renders
/// otherwise (Phi-4's and SmolVLM's ChatML, Mistral's and Llama 2's
/// `[INST]` variants).
fn detect_built_in(source: &str) -> Option<&'static str> {
    let has = |marker: &str| source.contains(marker);
    let name = if let Some((name, _)) = BUILT_IN.iter().find(|(n, _)| *n == source) {
        name
    } else if has("<|im_start|>") {
        if has("<|im_sep|>") || has("<end_of_utterance>") {
            return None;
        }
        "chatml"
    } else if source.starts_with("mistral")
        || has("[INST]")
        || OTHERS_FIRST.iter().any(|markers| markers.iter().all(|m| has(m)))
    {
        return None;
    } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
        "command-r"
    } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
        "llama3"
    } else {
        return None;
    };
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_follows_llama_cpp_markers() {
        let smollm2 = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
        assert_eq!(detect_built_in(smollm2), Some("chatml"));
        assert_eq!(detect_built_in("llama3"), Some("llama3"));
        assert_eq!(detect_built_in(LLAMA3), Some("llama3"));
        assert_eq!(detect_built_in(COMMAND_R), Some("command-r"));
        let gemma_with_header = "<start_of_turn><|start_header_id|><|end_header_id|>";
        for other in ["<|im_start|>{{ x }}<|im_sep|>", "[INST] {{ x }} [/INST]", "{{ messages }}", gemma_with_header] {
            assert_eq!(detect_built_in(other), None, "{other}");
        }
    }
}
