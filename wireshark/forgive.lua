-- Wireshark dissector for the FORGIVE transport header (FTH), on UDP port 17991.
--
-- The layout is docs/protocol.md's ("FTH: 16 bytes, big-endian"); the numbers below are
-- common/wire.py's, and tests/test_wireshark.py holds this block to that module, so the two
-- cannot drift. `make setup` copies this file where Wireshark looks for personal plugins
-- (~/.local/lib/wireshark/plugins/), so `tshark -r capture.pcapng` decodes FORGIVE with no flag.
--
-- Fields (for display filters and `tshark -T fields -e ...`): forgive.version, forgive.opcode,
-- forgive.flags (and forgive.flags.trimmed, .ece, .eligible, .exhausted, .retx, .last),
-- forgive.length, forgive.flow_id, forgive.seq, forgive.aux, forgive.payload_len (payload
-- bytes captured after the FTH), and forgive.trimmed, present on DATA a switch cut to its
-- header (`tshark -Y forgive.trimmed` lists the trims; an expert note marks each too).

-- BEGIN constants (common/wire.py)
local FORGIVE_UDP_PORT = 17991
local FTH_LEN = 16
local FTH_VERSION = 1
local OPCODES = { [0] = "DATA", [1] = "ACK", [2] = "NACK", [3] = "CNP" }
local FLAGS = {
    { "trimmed", "TRIMMED", 0x01 },
    { "ece", "ECE", 0x02 },
    { "eligible", "ELIGIBLE", 0x04 },
    { "exhausted", "EXHAUSTED", 0x08 },
    { "retx", "RETX", 0x10 },
    { "last", "LAST", 0x20 },
}
-- END constants

local DATA, ACK, NACK = 0, 1, 2
local TRIMMED = 0x01

-- What seq and aux mean for each opcode (docs/protocol.md's table).
local SEQ_MEANS = {
    [DATA] = "offset of the first payload byte",
    [ACK] = "rcv_nxt: all below is settled",
    [NACK] = "first byte requested",
}
local AUX_MEANS = {
    [DATA] = "the flow's total length",
    [ACK] = "start of the acknowledged range",
    [NACK] = "rcv_nxt",
}
local LENGTH_MEANS = {
    [DATA] = "payload bytes of the original packet",
    [ACK] = "length of the range acknowledged",
    [NACK] = "length of the range requested",
}

local forgive = Proto("forgive", "FORGIVE transport header")
local f = forgive.fields
f.version = ProtoField.uint8("forgive.version", "Version", base.DEC, nil, 0xF0)
f.opcode = ProtoField.uint8("forgive.opcode", "Opcode", base.DEC, OPCODES, 0x0F)
f.flags = ProtoField.uint8("forgive.flags", "Flags", base.HEX)
local flag_fields = {}
for _, flag in ipairs(FLAGS) do
    local abbr, name, bit = flag[1], flag[2], flag[3]
    flag_fields[#flag_fields + 1] = { name, bit,
        ProtoField.bool("forgive.flags." .. abbr, name, 8, nil, bit) }
    f["flag_" .. abbr] = flag_fields[#flag_fields][3]
end
f.length = ProtoField.uint16("forgive.length", "Length", base.DEC)
f.flow_id = ProtoField.uint32("forgive.flow_id", "Flow", base.DEC)
f.seq = ProtoField.uint32("forgive.seq", "Seq", base.DEC)
f.aux = ProtoField.uint32("forgive.aux", "Aux", base.DEC)
f.payload_len = ProtoField.uint32("forgive.payload_len", "Payload bytes captured", base.DEC)
f.trimmed = ProtoField.bool("forgive.trimmed", "Trimmed header")

local trimmed_note = ProtoExpert.new("forgive.expert.trimmed", "Trimmed DATA: a switch cut this "
    .. "packet to its header; length is the missing range", expert.group.SEQUENCE,
    expert.severity.NOTE)
local malformed = ProtoExpert.new("forgive.expert.malformed", "Not a FORGIVE header",
    expert.group.MALFORMED, expert.severity.ERROR)
forgive.experts = { trimmed_note, malformed }

-- The names of the flags set, joined by "+" as forgive-dissect prints them.
local function flag_names(flags)
    local names = {}
    for _, flag in ipairs(FLAGS) do
        if bit32.band(flags, flag[3]) ~= 0 then names[#names + 1] = flag[2] end
    end
    return table.concat(names, "+")
end

function forgive.dissector(tvb, pinfo, tree)
    if tvb:len() < FTH_LEN then
        local item = tree:add(forgive, tvb())
        item:add_proto_expert_info(malformed, string.format(
            "%d bytes captured, shorter than the %d-byte FTH", tvb:len(), FTH_LEN))
        return 0
    end
    local first = tvb(0, 1):uint()
    local version, opcode = bit32.rshift(first, 4), bit32.band(first, 0x0F)
    local flags = tvb(1, 1):uint()
    local length, flow, seq, aux = tvb(2, 2):uint(), tvb(4, 4):uint(), tvb(8, 4):uint(),
        tvb(12, 4):uint()
    local op = OPCODES[opcode] or string.format("opcode %d", opcode)
    local trimmed = opcode == DATA and bit32.band(flags, TRIMMED) ~= 0
    pinfo.cols.protocol = "FORGIVE"
    local names = flag_names(flags)
    pinfo.cols.info = string.format("%s%s flow=%d seq=%d len=%d aux=%d%s",
        trimmed and "TRIMMED " or "", op, flow, seq, length, aux,
        names ~= "" and (" [" .. names .. "]") or "")

    local fth = tree:add(forgive, tvb(0, FTH_LEN))
    fth:append_text(string.format(", %s, flow %d", op, flow))
    local v = fth:add(f.version, tvb(0, 1))
    if version ~= FTH_VERSION then
        v:add_proto_expert_info(malformed, string.format("FTH version %d, expected %d",
            version, FTH_VERSION))
    end
    fth:add(f.opcode, tvb(0, 1))
    local flag_tree = fth:add(f.flags, tvb(1, 1))
    if names ~= "" then flag_tree:append_text(" (" .. names .. ")") end
    for _, flag in ipairs(flag_fields) do flag_tree:add(flag[3], tvb(1, 1)) end
    local function meaning(item, means)
        if means[opcode] then item:append_text(" (" .. means[opcode] .. ")") end
    end
    meaning(fth:add(f.length, tvb(2, 2)), LENGTH_MEANS)
    fth:add(f.flow_id, tvb(4, 4))
    meaning(fth:add(f.seq, tvb(8, 4)), SEQ_MEANS)
    meaning(fth:add(f.aux, tvb(12, 4)), AUX_MEANS)
    local payload = tvb:len() - FTH_LEN
    fth:add(f.payload_len, payload):set_generated()
    if trimmed then
        local t = fth:add(f.trimmed, true)
        t:set_generated()
        t:add_proto_expert_info(trimmed_note, string.format(
            "Trimmed DATA: bytes [%d, %d) of flow %d cut by a switch", seq, seq + length, flow))
    end
    if payload > 0 then
        local what = trimmed and "Bytes a larger trim kept (ignored)" or "Payload"
        fth:add(tvb(FTH_LEN, payload), string.format("%s: %d bytes", what, payload))
    end
    return FTH_LEN
end

DissectorTable.get("udp.port"):add(FORGIVE_UDP_PORT, forgive)
