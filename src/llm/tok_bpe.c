/* tok_bpe.c: GPT-2 byte-level BPE for GGUF tokenizer.ggml.model = "gpt2".
 *
 * Encoding: (1) the pre-tokenizer splits the text into words with the GPT-2
 * pattern, written by hand here instead of a regex engine:
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (the "smollm"/"starcoder" family first isolates every \p{N} character, so
 * numbers become single digits); (2) each byte of a word is one initial symbol
 * (the token of its GPT-2 printable stand-in, e.g. ' ' -> 'Ġ'); (3) adjacent
 * symbols are merged by lowest merge rank (leftmost first on ties) with a
 * heap, O(n log n) per word.
 *
 * Unicode classes come from a range table generated from Python's
 * unicodedata (Unicode 14.0; llama.cpp uses a newer version, so characters
 * added after 14.0 may split differently):
 *     import unicodedata as u   # L = Lu Ll Lt Lm Lo -> 1, N = Nd Nl No -> 2
 *     k = lambda c: {'L': 1, 'N': 2}.get(u.category(chr(c))[0], 0)
 *     emit maximal runs of equal k != 0 as {lo | k << 24, hi}
 * \s is the Unicode White_Space property (listed in is_space).
 * The Llama 3 ("llama-bpe") split is also written out (llama3_split), and
 * like llama.cpp it takes a whole word that is a vocabulary entry as is;
 * Qwen2/Qwen3's ("qwen2") is the same pattern with one digit per number
 * (\p{N} instead of \p{N}{1,3}), so llama3_split takes the run length.
 * Non-goals: DeepSeek and other pre-tokenizers.
 */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include "formats/gguf.h"             /* defines: kn_gguf_get_str/arr                */
#include <stdlib.h>
#include <string.h>

/* ========================================================================== */
/* Unicode classes                                                            */
/* ========================================================================== */

static const uint32_t uni_ranges[782][2] = {
    {0x2000030,0x00039}, {0x1000041,0x0005a}, {0x1000061,0x0007a}, {0x10000aa,0x000aa},
    {0x20000b2,0x000b3}, {0x10000b5,0x000b5}, {0x20000b9,0x000b9}, {0x10000ba,0x000ba},
    {0x20000bc,0x000be}, {0x10000c0,0x000d6}, {0x10000d8,0x000f6}, {0x10000f8,0x002c1},
    {0x10002c6,0x002d1}, {0x10002e0,0x002e4}, {0x10002ec,0x002ec}, {0x10002ee,0x002ee},
    {0x1000370,0x00374}, {0x1000376,0x00377}, {0x100037a,0x0037d}, {0x100037f,0x0037f},
    {0x1000386,0x00386}, {0x1000388,0x0038a}, {0x100038c,0x0038c}, {0x100038e,0x003a1},
    {0x10003a3,0x003f5}, {0x10003f7,0x00481}, {0x100048a,0x0052f}, {0x1000531,0x00556},
    {0x1000559,0x00559}, {0x1000560,0x00588}, {0x10005d0,0x005ea}, {0x10005ef,0x005f2},
    {0x1000620,0x0064a}, {0x2000660,0x00669}, {0x100066e,0x0066f}, {0x1000671,0x006d3},
    {0x10006d5,0x006d5}, {0x10006e5,0x006e6}, {0x10006ee,0x006ef}, {0x20006f0,0x006f9},
    {0x10006fa,0x006fc}, {0x10006ff,0x006ff}, {0x1000710,0x00710}, {0x1000712,0x0072f},
    {0x100074d,0x007a5}, {0x10007b1,0x007b1}, {0x20007c0,0x007c9}, {0x10007ca,0x007ea},
    {0x10007f4,0x007f5}, {0x10007fa,0x007fa}, {0x1000800,0x00815}, {0x100081a,0x0081a},
    {0x1000824,0x00824}, {0x1000828,0x00828}, {0x1000840,0x00858}, {0x1000860,0x0086a},
    {0x1000870,0x00887}, {0x1000889,0x0088e}, {0x10008a0,0x008c9}, {0x1000904,0x00939},
    {0x100093d,0x0093d}, {0x1000950,0x00950}, {0x1000958,0x00961}, {0x2000966,0x0096f},
    {0x1000971,0x00980}, {0x1000985,0x0098c}, {0x100098f,0x00990}, {0x1000993,0x009a8},
    {0x10009aa,0x009b0}, {0x10009b2,0x009b2}, {0x10009b6,0x009b9}, {0x10009bd,0x009bd},
    {0x10009ce,0x009ce}, {0x10009dc,0x009dd}, {0x10009df,0x009e1}, {0x20009e6,0x009ef},
    {0x10009f0,0x009f1}, {0x20009f4,0x009f9}, {0x10009fc,0x009fc}, {0x1000a05,0x00a0a},
    {0x1000a0f,0x00a10}, {0x1000a13,0x00a28}, {0x1000a2a,0x00a30}, {0x1000a32,0x00a33},
    {0x1000a35,0x00a36}, {0x1000a38,0x00a39}, {0x1000a59,0x00a5c}, {0x1000a5e,0x00a5e},
    {0x2000a66,0x00a6f}, {0x1000a72,0x00a74}, {0x1000a85,0x00a8d}, {0x1000a8f,0x00a91},
    {0x1000a93,0x00aa8}, {0x1000aaa,0x00ab0}, {0x1000ab2,0x00ab3}, {0x1000ab5,0x00ab9},
    {0x1000abd,0x00abd}, {0x1000ad0,0x00ad0}, {0x1000ae0,0x00ae1}, {0x2000ae6,0x00aef},
    {0x1000af9,0x00af9}, {0x1000b05,0x00b0c}, {0x1000b0f,0x00b10}, {0x1000b13,0x00b28},
    {0x1000b2a,0x00b30}, {0x1000b32,0x00b33}, {0x1000b35,0x00b39}, {0x1000b3d,0x00b3d},
    {0x1000b5c,0x00b5d}, {0x1000b5f,0x00b61}, {0x2000b66,0x00b6f}, {0x1000b71,0x00b71},
    {0x2000b72,0x00b77}, {0x1000b83,0x00b83}, {0x1000b85,0x00b8a}, {0x1000b8e,0x00b90},
    {0x1000b92,0x00b95}, {0x1000b99,0x00b9a}, {0x1000b9c,0x00b9c}, {0x1000b9e,0x00b9f},
    {0x1000ba3,0x00ba4}, {0x1000ba8,0x00baa}, {0x1000bae,0x00bb9}, {0x1000bd0,0x00bd0},
    {0x2000be6,0x00bf2}, {0x1000c05,0x00c0c}, {0x1000c0e,0x00c10}, {0x1000c12,0x00c28},
    {0x1000c2a,0x00c39}, {0x1000c3d,0x00c3d}, {0x1000c58,0x00c5a}, {0x1000c5d,0x00c5d},
    {0x1000c60,0x00c61}, {0x2000c66,0x00c6f}, {0x2000c78,0x00c7e}, {0x1000c80,0x00c80},
    {0x1000c85,0x00c8c}, {0x1000c8e,0x00c90}, {0x1000c92,0x00ca8}, {0x1000caa,0x00cb3},
    {0x1000cb5,0x00cb9}, {0x1000cbd,0x00cbd}, {0x1000cdd,0x00cde}, {0x1000ce0,0x00ce1},
    {0x2000ce6,0x00cef}, {0x1000cf1,0x00cf2}, {0x1000d04,0x00d0c}, {0x1000d0e,0x00d10},
    {0x1000d12,0x00d3a}, {0x1000d3d,0x00d3d}, {0x1000d4e,0x00d4e}, {0x1000d54,0x00d56},
    {0x2000d58,0x00d5e}, {0x1000d5f,0x00d61}, {0x2000d66,0x00d78}, {0x1000d7a,0x00d7f},
    {0x1000d85,0x00d96}, {0x1000d9a,0x00db1}, {0x1000db3,0x00dbb}, {0x1000dbd,0x00dbd},
    {0x1000dc0,0x00dc6}, {0x2000de6,0x00def}, {0x1000e01,0x00e30}, {0x1000e32,0x00e33},
    {0x1000e40,0x00e46}, {0x2000e50,0x00e59}, {0x1000e81,0x00e82}, {0x1000e84,0x00e84},
    {0x1000e86,0x00e8a}, {0x1000e8c,0x00ea3}, {0x1000ea5,0x00ea5}, {0x1000ea7,0x00eb0},
    {0x1000eb2,0x00eb3}, {0x1000ebd,0x00ebd}, {0x1000ec0,0x00ec4}, {0x1000ec6,0x00ec6},
    {0x2000ed0,0x00ed9}, {0x1000edc,0x00edf}, {0x1000f00,0x00f00}, {0x2000f20,0x00f33},
    {0x1000f40,0x00f47}, {0x1000f49,0x00f6c}, {0x1000f88,0x00f8c}, {0x1001000,0x0102a},
    {0x100103f,0x0103f}, {0x2001040,0x01049}, {0x1001050,0x01055}, {0x100105a,0x0105d},
    {0x1001061,0x01061}, {0x1001065,0x01066}, {0x100106e,0x01070}, {0x1001075,0x01081},
    {0x100108e,0x0108e}, {0x2001090,0x01099}, {0x10010a0,0x010c5}, {0x10010c7,0x010c7},
    {0x10010cd,0x010cd}, {0x10010d0,0x010fa}, {0x10010fc,0x01248}, {0x100124a,0x0124d},
    {0x1001250,0x01256}, {0x1001258,0x01258}, {0x100125a,0x0125d}, {0x1001260,0x01288},
    {0x100128a,0x0128d}, {0x1001290,0x012b0}, {0x10012b2,0x012b5}, {0x10012b8,0x012be},
    {0x10012c0,0x012c0}, {0x10012c2,0x012c5}, {0x10012c8,0x012d6}, {0x10012d8,0x01310},
    {0x1001312,0x01315}, {0x1001318,0x0135a}, {0x2001369,0x0137c}, {0x1001380,0x0138f},
    {0x10013a0,0x013f5}, {0x10013f8,0x013fd}, {0x1001401,0x0166c}, {0x100166f,0x0167f},
    {0x1001681,0x0169a}, {0x10016a0,0x016ea}, {0x20016ee,0x016f0}, {0x10016f1,0x016f8},
    {0x1001700,0x01711}, {0x100171f,0x01731}, {0x1001740,0x01751}, {0x1001760,0x0176c},
    {0x100176e,0x01770}, {0x1001780,0x017b3}, {0x10017d7,0x017d7}, {0x10017dc,0x017dc},
    {0x20017e0,0x017e9}, {0x20017f0,0x017f9}, {0x2001810,0x01819}, {0x1001820,0x01878},
    {0x1001880,0x01884}, {0x1001887,0x018a8}, {0x10018aa,0x018aa}, {0x10018b0,0x018f5},
    {0x1001900,0x0191e}, {0x2001946,0x0194f}, {0x1001950,0x0196d}, {0x1001970,0x01974},
    {0x1001980,0x019ab}, {0x10019b0,0x019c9}, {0x20019d0,0x019da}, {0x1001a00,0x01a16},
    {0x1001a20,0x01a54}, {0x2001a80,0x01a89}, {0x2001a90,0x01a99}, {0x1001aa7,0x01aa7},
    {0x1001b05,0x01b33}, {0x1001b45,0x01b4c}, {0x2001b50,0x01b59}, {0x1001b83,0x01ba0},
    {0x1001bae,0x01baf}, {0x2001bb0,0x01bb9}, {0x1001bba,0x01be5}, {0x1001c00,0x01c23},
    {0x2001c40,0x01c49}, {0x1001c4d,0x01c4f}, {0x2001c50,0x01c59}, {0x1001c5a,0x01c7d},
    {0x1001c80,0x01c88}, {0x1001c90,0x01cba}, {0x1001cbd,0x01cbf}, {0x1001ce9,0x01cec},
    {0x1001cee,0x01cf3}, {0x1001cf5,0x01cf6}, {0x1001cfa,0x01cfa}, {0x1001d00,0x01dbf},
    {0x1001e00,0x01f15}, {0x1001f18,0x01f1d}, {0x1001f20,0x01f45}, {0x1001f48,0x01f4d},
    {0x1001f50,0x01f57}, {0x1001f59,0x01f59}, {0x1001f5b,0x01f5b}, {0x1001f5d,0x01f5d},
    {0x1001f5f,0x01f7d}, {0x1001f80,0x01fb4}, {0x1001fb6,0x01fbc}, {0x1001fbe,0x01fbe},
    {0x1001fc2,0x01fc4}, {0x1001fc6,0x01fcc}, {0x1001fd0,0x01fd3}, {0x1001fd6,0x01fdb},
    {0x1001fe0,0x01fec}, {0x1001ff2,0x01ff4}, {0x1001ff6,0x01ffc}, {0x2002070,0x02070},
    {0x1002071,0x02071}, {0x2002074,0x02079}, {0x100207f,0x0207f}, {0x2002080,0x02089},
    {0x1002090,0x0209c}, {0x1002102,0x02102}, {0x1002107,0x02107}, {0x100210a,0x02113},
    {0x1002115,0x02115}, {0x1002119,0x0211d}, {0x1002124,0x02124}, {0x1002126,0x02126},
    {0x1002128,0x02128}, {0x100212a,0x0212d}, {0x100212f,0x02139}, {0x100213c,0x0213f},
    {0x1002145,0x02149}, {0x100214e,0x0214e}, {0x2002150,0x02182}, {0x1002183,0x02184},
    {0x2002185,0x02189}, {0x2002460,0x0249b}, {0x20024ea,0x024ff}, {0x2002776,0x02793},
    {0x1002c00,0x02ce4}, {0x1002ceb,0x02cee}, {0x1002cf2,0x02cf3}, {0x2002cfd,0x02cfd},
    {0x1002d00,0x02d25}, {0x1002d27,0x02d27}, {0x1002d2d,0x02d2d}, {0x1002d30,0x02d67},
    {0x1002d6f,0x02d6f}, {0x1002d80,0x02d96}, {0x1002da0,0x02da6}, {0x1002da8,0x02dae},
    {0x1002db0,0x02db6}, {0x1002db8,0x02dbe}, {0x1002dc0,0x02dc6}, {0x1002dc8,0x02dce},
    {0x1002dd0,0x02dd6}, {0x1002dd8,0x02dde}, {0x1002e2f,0x02e2f}, {0x1003005,0x03006},
    {0x2003007,0x03007}, {0x2003021,0x03029}, {0x1003031,0x03035}, {0x2003038,0x0303a},
    {0x100303b,0x0303c}, {0x1003041,0x03096}, {0x100309d,0x0309f}, {0x10030a1,0x030fa},
    {0x10030fc,0x030ff}, {0x1003105,0x0312f}, {0x1003131,0x0318e}, {0x2003192,0x03195},
    {0x10031a0,0x031bf}, {0x10031f0,0x031ff}, {0x2003220,0x03229}, {0x2003248,0x0324f},
    {0x2003251,0x0325f}, {0x2003280,0x03289}, {0x20032b1,0x032bf}, {0x1003400,0x04dbf},
    {0x1004e00,0x0a48c}, {0x100a4d0,0x0a4fd}, {0x100a500,0x0a60c}, {0x100a610,0x0a61f},
    {0x200a620,0x0a629}, {0x100a62a,0x0a62b}, {0x100a640,0x0a66e}, {0x100a67f,0x0a69d},
    {0x100a6a0,0x0a6e5}, {0x200a6e6,0x0a6ef}, {0x100a717,0x0a71f}, {0x100a722,0x0a788},
    {0x100a78b,0x0a7ca}, {0x100a7d0,0x0a7d1}, {0x100a7d3,0x0a7d3}, {0x100a7d5,0x0a7d9},
    {0x100a7f2,0x0a801}, {0x100a803,0x0a805}, {0x100a807,0x0a80a}, {0x100a80c,0x0a822},
    {0x200a830,0x0a835}, {0x100a840,0x0a873}, {0x100a882,0x0a8b3}, {0x200a8d0,0x0a8d9},
    {0x100a8f2,0x0a8f7}, {0x100a8fb,0x0a8fb}, {0x100a8fd,0x0a8fe}, {0x200a900,0x0a909},
    {0x100a90a,0x0a925}, {0x100a930,0x0a946}, {0x100a960,0x0a97c}, {0x100a984,0x0a9b2},
    {0x100a9cf,0x0a9cf}, {0x200a9d0,0x0a9d9}, {0x100a9e0,0x0a9e4}, {0x100a9e6,0x0a9ef},
    {0x200a9f0,0x0a9f9}, {0x100a9fa,0x0a9fe}, {0x100aa00,0x0aa28}, {0x100aa40,0x0aa42},
    {0x100aa44,0x0aa4b}, {0x200aa50,0x0aa59}, {0x100aa60,0x0aa76}, {0x100aa7a,0x0aa7a},
    {0x100aa7e,0x0aaaf}, {0x100aab1,0x0aab1}, {0x100aab5,0x0aab6}, {0x100aab9,0x0aabd},
    {0x100aac0,0x0aac0}, {0x100aac2,0x0aac2}, {0x100aadb,0x0aadd}, {0x100aae0,0x0aaea},
    {0x100aaf2,0x0aaf4}, {0x100ab01,0x0ab06}, {0x100ab09,0x0ab0e}, {0x100ab11,0x0ab16},
    {0x100ab20,0x0ab26}, {0x100ab28,0x0ab2e}, {0x100ab30,0x0ab5a}, {0x100ab5c,0x0ab69},
    {0x100ab70,0x0abe2}, {0x200abf0,0x0abf9}, {0x100ac00,0x0d7a3}, {0x100d7b0,0x0d7c6},
    {0x100d7cb,0x0d7fb}, {0x100f900,0x0fa6d}, {0x100fa70,0x0fad9}, {0x100fb00,0x0fb06},
    {0x100fb13,0x0fb17}, {0x100fb1d,0x0fb1d}, {0x100fb1f,0x0fb28}, {0x100fb2a,0x0fb36},
    {0x100fb38,0x0fb3c}, {0x100fb3e,0x0fb3e}, {0x100fb40,0x0fb41}, {0x100fb43,0x0fb44},
    {0x100fb46,0x0fbb1}, {0x100fbd3,0x0fd3d}, {0x100fd50,0x0fd8f}, {0x100fd92,0x0fdc7},
    {0x100fdf0,0x0fdfb}, {0x100fe70,0x0fe74}, {0x100fe76,0x0fefc}, {0x200ff10,0x0ff19},
    {0x100ff21,0x0ff3a}, {0x100ff41,0x0ff5a}, {0x100ff66,0x0ffbe}, {0x100ffc2,0x0ffc7},
    {0x100ffca,0x0ffcf}, {0x100ffd2,0x0ffd7}, {0x100ffda,0x0ffdc}, {0x1010000,0x1000b},
    {0x101000d,0x10026}, {0x1010028,0x1003a}, {0x101003c,0x1003d}, {0x101003f,0x1004d},
    {0x1010050,0x1005d}, {0x1010080,0x100fa}, {0x2010107,0x10133}, {0x2010140,0x10178},
    {0x201018a,0x1018b}, {0x1010280,0x1029c}, {0x10102a0,0x102d0}, {0x20102e1,0x102fb},
    {0x1010300,0x1031f}, {0x2010320,0x10323}, {0x101032d,0x10340}, {0x2010341,0x10341},
    {0x1010342,0x10349}, {0x201034a,0x1034a}, {0x1010350,0x10375}, {0x1010380,0x1039d},
    {0x10103a0,0x103c3}, {0x10103c8,0x103cf}, {0x20103d1,0x103d5}, {0x1010400,0x1049d},
    {0x20104a0,0x104a9}, {0x10104b0,0x104d3}, {0x10104d8,0x104fb}, {0x1010500,0x10527},
    {0x1010530,0x10563}, {0x1010570,0x1057a}, {0x101057c,0x1058a}, {0x101058c,0x10592},
    {0x1010594,0x10595}, {0x1010597,0x105a1}, {0x10105a3,0x105b1}, {0x10105b3,0x105b9},
    {0x10105bb,0x105bc}, {0x1010600,0x10736}, {0x1010740,0x10755}, {0x1010760,0x10767},
    {0x1010780,0x10785}, {0x1010787,0x107b0}, {0x10107b2,0x107ba}, {0x1010800,0x10805},
    {0x1010808,0x10808}, {0x101080a,0x10835}, {0x1010837,0x10838}, {0x101083c,0x1083c},
    {0x101083f,0x10855}, {0x2010858,0x1085f}, {0x1010860,0x10876}, {0x2010879,0x1087f},
    {0x1010880,0x1089e}, {0x20108a7,0x108af}, {0x10108e0,0x108f2}, {0x10108f4,0x108f5},
    {0x20108fb,0x108ff}, {0x1010900,0x10915}, {0x2010916,0x1091b}, {0x1010920,0x10939},
    {0x1010980,0x109b7}, {0x20109bc,0x109bd}, {0x10109be,0x109bf}, {0x20109c0,0x109cf},
    {0x20109d2,0x109ff}, {0x1010a00,0x10a00}, {0x1010a10,0x10a13}, {0x1010a15,0x10a17},
    {0x1010a19,0x10a35}, {0x2010a40,0x10a48}, {0x1010a60,0x10a7c}, {0x2010a7d,0x10a7e},
    {0x1010a80,0x10a9c}, {0x2010a9d,0x10a9f}, {0x1010ac0,0x10ac7}, {0x1010ac9,0x10ae4},
    {0x2010aeb,0x10aef}, {0x1010b00,0x10b35}, {0x1010b40,0x10b55}, {0x2010b58,0x10b5f},
    {0x1010b60,0x10b72}, {0x2010b78,0x10b7f}, {0x1010b80,0x10b91}, {0x2010ba9,0x10baf},
    {0x1010c00,0x10c48}, {0x1010c80,0x10cb2}, {0x1010cc0,0x10cf2}, {0x2010cfa,0x10cff},
    {0x1010d00,0x10d23}, {0x2010d30,0x10d39}, {0x2010e60,0x10e7e}, {0x1010e80,0x10ea9},
    {0x1010eb0,0x10eb1}, {0x1010f00,0x10f1c}, {0x2010f1d,0x10f26}, {0x1010f27,0x10f27},
    {0x1010f30,0x10f45}, {0x2010f51,0x10f54}, {0x1010f70,0x10f81}, {0x1010fb0,0x10fc4},
    {0x2010fc5,0x10fcb}, {0x1010fe0,0x10ff6}, {0x1011003,0x11037}, {0x2011052,0x1106f},
    {0x1011071,0x11072}, {0x1011075,0x11075}, {0x1011083,0x110af}, {0x10110d0,0x110e8},
    {0x20110f0,0x110f9}, {0x1011103,0x11126}, {0x2011136,0x1113f}, {0x1011144,0x11144},
    {0x1011147,0x11147}, {0x1011150,0x11172}, {0x1011176,0x11176}, {0x1011183,0x111b2},
    {0x10111c1,0x111c4}, {0x20111d0,0x111d9}, {0x10111da,0x111da}, {0x10111dc,0x111dc},
    {0x20111e1,0x111f4}, {0x1011200,0x11211}, {0x1011213,0x1122b}, {0x1011280,0x11286},
    {0x1011288,0x11288}, {0x101128a,0x1128d}, {0x101128f,0x1129d}, {0x101129f,0x112a8},
    {0x10112b0,0x112de}, {0x20112f0,0x112f9}, {0x1011305,0x1130c}, {0x101130f,0x11310},
    {0x1011313,0x11328}, {0x101132a,0x11330}, {0x1011332,0x11333}, {0x1011335,0x11339},
    {0x101133d,0x1133d}, {0x1011350,0x11350}, {0x101135d,0x11361}, {0x1011400,0x11434},
    {0x1011447,0x1144a}, {0x2011450,0x11459}, {0x101145f,0x11461}, {0x1011480,0x114af},
    {0x10114c4,0x114c5}, {0x10114c7,0x114c7}, {0x20114d0,0x114d9}, {0x1011580,0x115ae},
    {0x10115d8,0x115db}, {0x1011600,0x1162f}, {0x1011644,0x11644}, {0x2011650,0x11659},
    {0x1011680,0x116aa}, {0x10116b8,0x116b8}, {0x20116c0,0x116c9}, {0x1011700,0x1171a},
    {0x2011730,0x1173b}, {0x1011740,0x11746}, {0x1011800,0x1182b}, {0x10118a0,0x118df},
    {0x20118e0,0x118f2}, {0x10118ff,0x11906}, {0x1011909,0x11909}, {0x101190c,0x11913},
    {0x1011915,0x11916}, {0x1011918,0x1192f}, {0x101193f,0x1193f}, {0x1011941,0x11941},
    {0x2011950,0x11959}, {0x10119a0,0x119a7}, {0x10119aa,0x119d0}, {0x10119e1,0x119e1},
    {0x10119e3,0x119e3}, {0x1011a00,0x11a00}, {0x1011a0b,0x11a32}, {0x1011a3a,0x11a3a},
    {0x1011a50,0x11a50}, {0x1011a5c,0x11a89}, {0x1011a9d,0x11a9d}, {0x1011ab0,0x11af8},
    {0x1011c00,0x11c08}, {0x1011c0a,0x11c2e}, {0x1011c40,0x11c40}, {0x2011c50,0x11c6c},
    {0x1011c72,0x11c8f}, {0x1011d00,0x11d06}, {0x1011d08,0x11d09}, {0x1011d0b,0x11d30},
    {0x1011d46,0x11d46}, {0x2011d50,0x11d59}, {0x1011d60,0x11d65}, {0x1011d67,0x11d68},
    {0x1011d6a,0x11d89}, {0x1011d98,0x11d98}, {0x2011da0,0x11da9}, {0x1011ee0,0x11ef2},
    {0x1011fb0,0x11fb0}, {0x2011fc0,0x11fd4}, {0x1012000,0x12399}, {0x2012400,0x1246e},
    {0x1012480,0x12543}, {0x1012f90,0x12ff0}, {0x1013000,0x1342e}, {0x1014400,0x14646},
    {0x1016800,0x16a38}, {0x1016a40,0x16a5e}, {0x2016a60,0x16a69}, {0x1016a70,0x16abe},
    {0x2016ac0,0x16ac9}, {0x1016ad0,0x16aed}, {0x1016b00,0x16b2f}, {0x1016b40,0x16b43},
    {0x2016b50,0x16b59}, {0x2016b5b,0x16b61}, {0x1016b63,0x16b77}, {0x1016b7d,0x16b8f},
    {0x1016e40,0x16e7f}, {0x2016e80,0x16e96}, {0x1016f00,0x16f4a}, {0x1016f50,0x16f50},
    {0x1016f93,0x16f9f}, {0x1016fe0,0x16fe1}, {0x1016fe3,0x16fe3}, {0x1017000,0x187f7},
    {0x1018800,0x18cd5}, {0x1018d00,0x18d08}, {0x101aff0,0x1aff3}, {0x101aff5,0x1affb},
    {0x101affd,0x1affe}, {0x101b000,0x1b122}, {0x101b150,0x1b152}, {0x101b164,0x1b167},
    {0x101b170,0x1b2fb}, {0x101bc00,0x1bc6a}, {0x101bc70,0x1bc7c}, {0x101bc80,0x1bc88},
    {0x101bc90,0x1bc99}, {0x201d2e0,0x1d2f3}, {0x201d360,0x1d378}, {0x101d400,0x1d454},
    {0x101d456,0x1d49c}, {0x101d49e,0x1d49f}, {0x101d4a2,0x1d4a2}, {0x101d4a5,0x1d4a6},
    {0x101d4a9,0x1d4ac}, {0x101d4ae,0x1d4b9}, {0x101d4bb,0x1d4bb}, {0x101d4bd,0x1d4c3},
    {0x101d4c5,0x1d505}, {0x101d507,0x1d50a}, {0x101d50d,0x1d514}, {0x101d516,0x1d51c},
    {0x101d51e,0x1d539}, {0x101d53b,0x1d53e}, {0x101d540,0x1d544}, {0x101d546,0x1d546},
    {0x101d54a,0x1d550}, {0x101d552,0x1d6a5}, {0x101d6a8,0x1d6c0}, {0x101d6c2,0x1d6da},
    {0x101d6dc,0x1d6fa}, {0x101d6fc,0x1d714}, {0x101d716,0x1d734}, {0x101d736,0x1d74e},
    {0x101d750,0x1d76e}, {0x101d770,0x1d788}, {0x101d78a,0x1d7a8}, {0x101d7aa,0x1d7c2},
    {0x101d7c4,0x1d7cb}, {0x201d7ce,0x1d7ff}, {0x101df00,0x1df1e}, {0x101e100,0x1e12c},
    {0x101e137,0x1e13d}, {0x201e140,0x1e149}, {0x101e14e,0x1e14e}, {0x101e290,0x1e2ad},
    {0x101e2c0,0x1e2eb}, {0x201e2f0,0x1e2f9}, {0x101e7e0,0x1e7e6}, {0x101e7e8,0x1e7eb},
    {0x101e7ed,0x1e7ee}, {0x101e7f0,0x1e7fe}, {0x101e800,0x1e8c4}, {0x201e8c7,0x1e8cf},
    {0x101e900,0x1e943}, {0x101e94b,0x1e94b}, {0x201e950,0x1e959}, {0x201ec71,0x1ecab},
    {0x201ecad,0x1ecaf}, {0x201ecb1,0x1ecb4}, {0x201ed01,0x1ed2d}, {0x201ed2f,0x1ed3d},
    {0x101ee00,0x1ee03}, {0x101ee05,0x1ee1f}, {0x101ee21,0x1ee22}, {0x101ee24,0x1ee24},
    {0x101ee27,0x1ee27}, {0x101ee29,0x1ee32}, {0x101ee34,0x1ee37}, {0x101ee39,0x1ee39},
    {0x101ee3b,0x1ee3b}, {0x101ee42,0x1ee42}, {0x101ee47,0x1ee47}, {0x101ee49,0x1ee49},
    {0x101ee4b,0x1ee4b}, {0x101ee4d,0x1ee4f}, {0x101ee51,0x1ee52}, {0x101ee54,0x1ee54},
    {0x101ee57,0x1ee57}, {0x101ee59,0x1ee59}, {0x101ee5b,0x1ee5b}, {0x101ee5d,0x1ee5d},
    {0x101ee5f,0x1ee5f}, {0x101ee61,0x1ee62}, {0x101ee64,0x1ee64}, {0x101ee67,0x1ee6a},
    {0x101ee6c,0x1ee72}, {0x101ee74,0x1ee77}, {0x101ee79,0x1ee7c}, {0x101ee7e,0x1ee7e},
    {0x101ee80,0x1ee89}, {0x101ee8b,0x1ee9b}, {0x101eea1,0x1eea3}, {0x101eea5,0x1eea9},
    {0x101eeab,0x1eebb}, {0x201f100,0x1f10c}, {0x201fbf0,0x1fbf9}, {0x1020000,0x2a6df},
    {0x102a700,0x2b738}, {0x102b740,0x2b81d}, {0x102b820,0x2cea1}, {0x102ceb0,0x2ebe0},
    {0x102f800,0x2fa1d}, {0x1030000,0x3134a},
};

enum { CF_LETTER = KN_CF_LETTER, CF_NUMBER = KN_CF_NUMBER, CF_SPACE = KN_CF_SPACE, CF_OTHER = KN_CF_OTHER };

static bool is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* CF_* flags of one code point (never 0). */
unsigned kn__cp_class(uint32_t c) {
    if (is_space(c)) return CF_SPACE;
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CF_LETTER;
        if (c >= '0' && c <= '9') return CF_NUMBER;
        return CF_OTHER;
    }
    size_t lo = 0, hi = sizeof uni_ranges / sizeof uni_ranges[0];
    while (lo < hi) {                                     /* first range with hi >= c */
        size_t mid = (lo + hi) / 2;
        if (uni_ranges[mid][1] < c) lo = mid + 1; else hi = mid;
    }
    if (lo < sizeof uni_ranges / sizeof uni_ranges[0] && (uni_ranges[lo][0] & 0xFFFFFF) <= c)
        return uni_ranges[lo][0] >> 24;                   /* 1 = letter, 2 = number */
    return CF_OTHER;
}

/* ========================================================================== */
/* GPT-2 byte <-> printable code point map                                    */
/* ========================================================================== */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 get
 * code points 256, 257, ... in byte order. */
uint32_t kn__byte_to_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
    return 256 + k;
}

int kn__cp_to_byte(uint32_t cp) {
    if (cp < 256) return ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned k = 0;
    for (unsigned x = 0; x < 256; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) {
            if (k == cp - 256) return (int)x;
            k++;
        }
    return -1;
}

size_t kn__bpe_piece(const kn_tokenizer *t, int32_t id, char *dst) {
    size_t n; const char *s = kn__tok_text(t, id, &n);
    int ty = t->types[id];
    if (ty != KN_TOKEN_NORMAL && ty != KN_TOKEN_BYTE) { memcpy(dst, s, n); return n; }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        uint32_t cp; int k;
        if (kn_utf8_valid_prefix(s + i, n - i) == 0) { dst[o++] = s[i++]; continue; }  /* junk: keep raw */
        k = kn__utf8_decode(u, n - i, &cp);
        int b = kn__cp_to_byte(cp);
        if (b >= 0) dst[o++] = (char)b;
        else { memcpy(dst + o, u, (size_t)k); o += (size_t)k; }
        i += (size_t)k;
    }
    return o;
}

/* ========================================================================== */
/* encoding                                                                   */
/* ========================================================================== */

typedef struct bpe_ctx {
    const kn_tokenizer *t;
    kn_idvec *out;
    kn_bpe_sym *sym; size_t sym_cap;
    kn_heap heap;
    const char *text;    /* the run being split (bpe_span's offsets are into it) */
} bpe_ctx;

/* BPE over the bytes of one pre-tokenized word. */
static kn_status bpe_word(bpe_ctx *c, const unsigned char *w, size_t n) {
    const kn_tokenizer *t = c->t;
    if (n > (size_t)INT32_MAX) return kn_set_error(KN_ERR_LIMIT, "tokenize: word of %zu bytes is too long", n);
    if (n > c->sym_cap) {
        kn_bpe_sym *ns = realloc(c->sym, n * sizeof *ns);
        if (!ns) return kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory for a %zu-byte word", n);
        c->sym = ns; c->sym_cap = n;
    }
    if (t->pretok == KN_PRETOK_LLAMA3 && n <= 256) {
        /* Llama 3 (as llama.cpp: ignore_merges): a word that is a vocabulary
         * entry as a whole is that entry, even where merges would not reach it */
        char mapped[512]; size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)kn__utf8_encode(kn__byte_to_cp(w[i]), mapped + m);
        int32_t id = kn__tok_lookup(t, mapped, m);
        if (id >= 0) return kn__idvec_push(c->out, id);
    }
    /* A byte with no token in the vocabulary is dropped, as Hugging Face's
     * byte-level BPE drops it (its model has no unknown token): mapping it
     * to tokenizer.ggml.unknown_token_id injected <|endoftext|> (id 0) into
     * SmolLM2 prompts. */
    kn_bpe_sym *s = c->sym;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) s[m++].id = id;
    }
    return kn__bpe_merge_syms(t, s, m, &c->heap, c->out);
}

/* GPT-2 split of code points cp[b..e) (one segment; nothing outside it is
 * seen, as with llama.cpp's sequential regexes). boff maps code point index
 * to byte offset in text. */
static kn_status gpt2_split(kn__span_fn emit, void *c, const uint32_t *cp, const size_t *boff,
                            size_t b, size_t e) {
#define FL(i) ((i) < e ? kn__cp_class(cp[i]) : 0u)
    size_t pos = b;
    while (pos < e) {
        size_t start = pos;
        uint32_t ch = cp[pos];
        unsigned f = FL(pos);
        /* 's 't 're 've 'm 'll 'd */
        if (ch == '\'' && pos + 1 < e) {
            uint32_t n1 = cp[pos + 1], n2 = pos + 2 < e ? cp[pos + 2] : 0;
            if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') pos += 2;
            else if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) pos += 3;
        }
        if (pos == start) {
            unsigned f2 = ch == ' ' ? FL(pos + 1) : f;   /* class after an optional leading space */
            if (f2 & (CF_LETTER | CF_NUMBER | CF_OTHER)) {
                unsigned want = f2 & (CF_LETTER | CF_NUMBER | CF_OTHER);
                pos += ch == ' ';
                while (pos < e && (FL(pos) & want)) pos++;
            } else {
                size_t nws = 0;
                while (pos + nws < e && (FL(pos + nws) & CF_SPACE)) nws++;
                if (nws > 1 && pos + nws < e) pos += nws - 1;  /* \s+(?!\S): leave one for the next word */
                else if (nws > 0) pos += nws;                  /* \s+ */
                else pos++;
            }
        }
        kn_status st = emit(c, boff[start], boff[pos] - boff[start]);
        if (st != KN_OK) return st;
    }
#undef FL
    return KN_OK;
}

/* Llama 3 split of cp[b..e) (llama.cpp's adaptation of the tiktoken pattern):
 *   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Alternatives are tried in order at each position; the first that matches wins.
 * max_digits 3 is that pattern; 1 is Qwen2's (\p{N} alone, otherwise the same). */
static kn_status llama3_split(kn__span_fn emit, void *c, const uint32_t *cp, const size_t *boff,
                              size_t b, size_t e, size_t max_digits) {
#define FL(i) ((i) < e ? kn__cp_class(cp[i]) : 0u)
#define LOW(i) ((i) < e && cp[i] < 0x80 ? (cp[i] | 0x20u) : 0u)
#define NL(i) ((i) < e && (cp[i] == '\r' || cp[i] == '\n'))
    size_t pos = b;
    while (pos < e) {
        size_t start = pos;
        uint32_t ch = cp[pos];
        unsigned f = FL(pos);
        if (ch == '\'' && pos + 1 < e) {                               /* contractions, any case */
            uint32_t n1 = LOW(pos + 1), n2 = LOW(pos + 2);
            if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') pos += 2;
            else if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) pos += 3;
        }
        if (pos == start && ((f & CF_LETTER) ||                        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
                             (!(f & CF_NUMBER) && !NL(pos) && (FL(pos + 1) & CF_LETTER)))) {
            pos++;
            while (FL(pos) & CF_LETTER) pos++;
        }
        if (pos == start && (f & CF_NUMBER)) {                         /* \p{N}{1,max_digits} */
            while (pos < e && pos - start < max_digits && (FL(pos) & CF_NUMBER)) pos++;
        }
        if (pos == start && ((f & CF_OTHER) || (ch == ' ' && (FL(pos + 1) & CF_OTHER)))) {
            pos += ch == ' ';                                          /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
            while (FL(pos) & CF_OTHER) pos++;
            while (NL(pos)) pos++;
        }
        if (pos == start) {                                            /* whitespace alternatives */
            size_t q = pos, last_nl = SIZE_MAX;
            while (q < e && (FL(q) & CF_SPACE)) { if (NL(q)) last_nl = q; q++; }
            if (last_nl != SIZE_MAX) pos = last_nl + 1;                /* \s*[\r\n]+ */
            else if (q - pos > 1 && q < e) pos = q - 1;                /* \s+(?!\S) */
            else if (q > pos) pos = q;                                 /* \s+ */
            else pos++;
        }
        kn_status st = emit(c, boff[start], boff[pos] - boff[start]);
        if (st != KN_OK) return st;
    }
#undef FL
#undef LOW
#undef NL
    return KN_OK;
}

kn_status kn__pretok_split(kn_pretok kind, const char *text, size_t len, kn__span_fn emit, void *ctx) {
    if (len == 0) return KN_OK;
    uint32_t *cp = malloc(len * sizeof *cp);
    size_t *boff = malloc((len + 1) * sizeof *boff);
    kn_status st = KN_OK;
    if (!cp || !boff) { st = kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory for %zu bytes", len); goto done; }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        boff[n] = i;
        i += (size_t)kn__utf8_decode((const unsigned char *)text + i, len - i, &cp[n]);
        n++;
    }
    boff[n] = len;
    if (kind == KN_PRETOK_DIGITS_GPT2) {
        /* \p{N} first: every number character is its own segment */
        size_t b = 0;
        for (size_t i = 0; i < n && st == KN_OK; i++) {
            if (kn__cp_class(cp[i]) != CF_NUMBER) continue;
            if (b < i) st = gpt2_split(emit, ctx, cp, boff, b, i);
            if (st == KN_OK) st = gpt2_split(emit, ctx, cp, boff, i, i + 1);
            b = i + 1;
        }
        if (st == KN_OK && b < n) st = gpt2_split(emit, ctx, cp, boff, b, n);
    } else if (kind == KN_PRETOK_LLAMA3) {
        st = llama3_split(emit, ctx, cp, boff, 0, n, 3);
    } else if (kind == KN_PRETOK_QWEN2) {
        st = llama3_split(emit, ctx, cp, boff, 0, n, 1);
    } else {
        st = gpt2_split(emit, ctx, cp, boff, 0, n);
    }
done:
    free(cp); free(boff);
    return st;
}

static kn_status bpe_span(void *ctx, size_t off, size_t len) {
    bpe_ctx *c = ctx;
    return bpe_word(c, (const unsigned char *)c->text + off, len);
}

kn_status kn__bpe_encode(const kn_tokenizer *t, const char *text, size_t len, kn_idvec *out) {
    bpe_ctx c = {t, out, NULL, 0, {0}, text};
    kn_status st = kn__pretok_split(t->pretok, text, len, bpe_span, &c);
    free(c.sym); free(c.heap.v);
    return st;
}

/* ========================================================================== */
/* GGUF "gpt2" vocabulary                                                     */
/* ========================================================================== */

static kn_status load_merges(kn_tokenizer *t, const kn_gguf *g) {
    const char *K = "tokenizer.ggml.merges";
    kn_gguf_type et; uint64_t n; const void *data;
    if (!kn_gguf_get_arr(g, K, &et, &n, &data) || et != KN_GGUF_STRING)
        return kn_set_error(KN_ERR_FORMAT, "GGUF: a \"gpt2\" vocabulary needs %s (string array)", K);
    if (n > (1u << 24)) return kn_set_error(KN_ERR_FORMAT, "GGUF: %s has %llu entries (limit 2^24)", K,
                                            (unsigned long long)n);
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for %llu merges",
                                        (unsigned long long)n);
    t->merge_cap = cap;
    for (size_t i = 0; i < cap; i++) t->merges[i] = (kn_bpe_merge){0, -1, -1};
    char *cat = NULL; size_t cat_cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        kn_gguf_str s = kn_gguf_arr_str(g, K, i);
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) { free(cat); return kn_set_error(KN_ERR_FORMAT, "GGUF: merge %llu (\"%.*s\") is not \"left right\"",
                                                  (unsigned long long)i, (int)(s.len > 40 ? 40 : s.len), s.ptr); }
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        int32_t l = kn__tok_lookup(t, s.ptr, ll), r = kn__tok_lookup(t, sp + 1, rl);
        if (ll + rl > cat_cap) {
            char *nc = realloc(cat, ll + rl);
            if (!nc) { free(cat); return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory"); }
            cat = nc; cat_cap = ll + rl;
        }
        memcpy(cat, s.ptr, ll); memcpy(cat + ll, sp + 1, rl);
        int32_t m = kn__tok_lookup(t, cat, ll + rl);
        if (l < 0 || r < 0 || m < 0) continue;   /* refers to pieces not in the vocabulary: unusable */
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
        size_t j = kn__merge_probe(t->merges, cap, key);
        if (t->merges[j].rank < 0) t->merges[j] = (kn_bpe_merge){key, (int32_t)i, m};  /* first rank wins */
    }
    free(cat);
    return KN_OK;
}

static kn_status pick_pretok(kn_tokenizer *t, const kn_gguf *g) {
    kn_gguf_str pre;
    t->pretok = KN_PRETOK_GPT2;
    if (!kn_gguf_get_str(g, "tokenizer.ggml.pre", &pre)) return KN_OK;
    static const char *const gpt2[] = {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"};
    static const char *const digits[] = {"smollm", "starcoder", "refact", "command-r", "codeshell",
                                         "exaone", "minerva-7b"};
    for (size_t i = 0; i < sizeof gpt2 / sizeof *gpt2; i++)
        if (pre.len == strlen(gpt2[i]) && memcmp(pre.ptr, gpt2[i], pre.len) == 0) return KN_OK;
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3"};
    for (size_t i = 0; i < sizeof llama3 / sizeof *llama3; i++)
        if (pre.len == strlen(llama3[i]) && memcmp(pre.ptr, llama3[i], pre.len) == 0) {
            t->pretok = KN_PRETOK_LLAMA3;
            return KN_OK;
        }
    for (size_t i = 0; i < sizeof digits / sizeof *digits; i++)
        if (pre.len == strlen(digits[i]) && memcmp(pre.ptr, digits[i], pre.len) == 0) {
            t->pretok = KN_PRETOK_DIGITS_GPT2;
            return KN_OK;
        }
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen"};     /* Qwen2, Qwen2.5, Qwen3 */
    for (size_t i = 0; i < sizeof qwen2 / sizeof *qwen2; i++)
        if (pre.len == strlen(qwen2[i]) && memcmp(pre.ptr, qwen2[i], pre.len) == 0) {
            t->pretok = KN_PRETOK_QWEN2;
            return KN_OK;
        }
    return kn_set_error(KN_ERR_UNSUPPORTED, "GGUF tokenizer.ggml.pre = \"%.*s\" is not supported; kiln "
                        "implements the \"gpt2\"/\"default\", \"smollm\"/\"starcoder\", \"llama-bpe\" (Llama 3) and "
                        "\"qwen2\" pre-tokenizers",
                        (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
}

kn_status kn__bpe_from_gguf(const kn_gguf *g, kn_tokenizer **out) {
    kn_tokenizer *t;
    kn_status st = kn__tok_from_gguf_common(g, KN_TOKENIZER_BPE, &t);
    if (st != KN_OK) return st;
    st = pick_pretok(t, g);
    if (st == KN_OK) st = kn__tok_finish(t, kn__bpe_piece);   /* builds the lookup table used below */
    if (st == KN_OK) st = load_merges(t, g);
    if (st != KN_OK) { kn_tokenizer_free(t); return st; }
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = kn__utf8_encode(kn__byte_to_cp((unsigned)b), u);
        t->byte_id[b] = kn__tok_lookup(t, u, (size_t)k);
    }
    *out = t;
    return KN_OK;
}
