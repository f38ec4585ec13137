"""Writes a copy of a GGUF file with some tensors requantized: what
llama-quantize does, for the types the `gguf` package can quantize (Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0). Metadata and every other tensor are copied as they
are; a requantized tensor starts from the package's dequantization of the
original."""
import re

import gguf

import gguf_files


def requantize(source, target, rules):
    """`rules`: [(regular expression over tensor names, GGMLQuantizationType)];
    the first that matches a whole name applies. Returns {name: type} of the
    tensors requantized."""
    reader = gguf_files.read(source)
    writer = gguf.GGUFWriter(target, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        # The architecture and the GGUF.* header fields are the writer's own.
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)
    changed = {}
    for t in reader.tensors:
        kind = next((k for pattern, k in rules if re.fullmatch(pattern, t.name)), None)
        if kind is None:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        writer.add_tensor(t.name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        changed[t.name] = kind
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed
