//! The restricted unpickler on arbitrary bytes, with torch's persistent ids.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = convert::pickle::unpickle(data, convert::pickle::torch_storage) {
        let _ = v.root.get("state_dict").map(|sd| sd.dict_entries());
    }
});
