"""Model families by name (config.json's model_type): one module each, a Family subclass and its
FAMILY (lib/models/families/base.py says what a family describes). Adding one is its module, its entry
below and its test in tests/test_hf.py (an encoder-decoder's in tests/test_hf_seq2seq.py); no other file
names a family (tests/test_layout.py fails on a family's name as a string outside its module)."""
from lib.models.families import bart, bert, distilbert, electra, esm, gpt2, roberta, roberta_prelayernorm, t5, xlm
from lib.models.families.base import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (bert.FAMILY, roberta.FAMILY, electra.FAMILY, distilbert.FAMILY,
                                                   roberta_prelayernorm.FAMILY, gpt2.FAMILY, esm.FAMILY, xlm.FAMILY,
                                                   t5.FAMILY, bart.FAMILY)}
