"""The generated WebShop-lite catalogue (the default): products over 30 categories and their goals.

Products have a scraped WebShop product's fields, drawn from fixed vocabularies with one ``random.Random(seed)``,
so the same arguments give the same catalogue in every process (its streams are stable on Python >= 3.10). Goals
follow WebShop's synthetic-goal recipe. Deviations: a price range's reward price is drawn at generation (WebShop
draws it at load time from the process RNG, irreproducibly); at most `GOALS_PER_PRODUCT` option combinations per
product (WebShop takes all), so products with many options do not dominate the goal set.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from env_servers.envs.webshop.catalogue import (
    _FUNCTION_WORDS,
    CATALOGUE_VERSION,
    DEFAULT_NUM_PRODUCTS,
    DEFAULT_SEED,
    GOAL_SHUFFLE_SEED,
    GOALS_PER_PRODUCT,
    Catalogue,
    Goal,
    Product,
    option_text,
    price_text,
    price_upper_for,
    tokens,
)


@dataclass(frozen=True)
class _Category:
    key: str
    path: str  # "Dept › Sub"; the product type is the leaf
    types: tuple[str, ...]
    audience: str  # e.g. "for women", or ""
    query_fmt: str  # e.g. "women's {type}"
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    materials: tuple[str, ...] = ()


_COLORS = (
    "black", "white", "grey", "navy blue", "red", "pink", "beige", "brown", "green", "purple", "yellow", "sky blue",
)  # fmt: skip
_APPAREL = ("x-small", "small", "medium", "large", "x-large", "xx-large")
_W_SHOES = ("5", "5.5", "6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "11")
_M_SHOES = ("7", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12", "13")
_PACKS = ("pack of 1", "pack of 2", "pack of 3", "pack of 4", "pack of 6", "pack of 12", "pack of 24")
_FL_OZ = ("1 fl oz", "1.7 fl oz", "3.4 fl oz", "8 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz")
_OUNCES = ("4 ounce", "8 ounce", "12 ounce", "16 ounce", "32 ounce", "2 pound", "5 pound")
_COUNTS = ("30 count", "60 count", "90 count", "120 count", "180 count", "240 count")
_SCENTS = ("lavender", "unscented", "coconut", "citrus", "eucalyptus", "rose", "fresh linen", "sandalwood")
_SNACK_FLAVORS = (
    "chocolate", "sea salt", "bbq", "honey roasted", "peanut butter", "original", "teriyaki", "cinnamon", "cheddar",
)  # fmt: skip
_DRINK_FLAVORS = ("original", "vanilla", "hazelnut", "lemon", "peach", "mint", "berry", "ginger")
_SHADES = ("nude", "ruby red", "coral", "mauve", "berry", "ivory", "natural beige", "sand", "mocha", "plum")
_BED = ("twin", "full", "queen", "king", "california king")
_ROOM = ("16x20 inch", "24x36 inch", "52x84 inch", "5x7 ft", "8x10 ft", "20x20 inch")
_WOOD = ("walnut", "espresso", "white", "black", "grey", "natural", "oak")
_METAL = ("gold", "silver", "rose gold", "black")
_PHONES = ("iphone 13", "iphone 14 pro", "iphone 15", "galaxy s23", "galaxy s24", "pixel 7", "pixel 8")
_PET = ("small", "medium", "large", "x-large")
_PET_FLAVORS = ("chicken", "beef", "salmon", "lamb", "turkey", "duck")
_BABY = ("newborn", "size 1", "size 2", "size 3", "size 4", "size 5")

_CATEGORIES: tuple[_Category, ...] = (
    _Category("hair care", "Beauty & Personal Care › Hair Care",
              ("shampoo", "conditioner", "hair mask", "dry shampoo", "hair oil"), "", "{type}",
              ("sulfate free", "paraben free", "natural ingredients", "long lasting", "dry hair", "damaged hair",
               "color safe", "cruelty free", "hair growth", "anti dandruff"),
              (("size", _FL_OZ), ("scent", _SCENTS)), (6, 45), ("argan oil", "keratin", "biotin", "tea tree")),
    _Category("skin care", "Beauty & Personal Care › Skin Care",
              ("face moisturizer", "facial cleanser", "face serum", "sunscreen", "eye cream"), "", "{type}",
              ("hyaluronic acid", "fine lines", "sensitive skin", "oil free", "fragrance free", "dark circles",
               "anti aging", "vitamin c", "non greasy", "dermatologist tested"),
              (("size", _FL_OZ),), (8, 80), ("aloe vera", "retinol", "niacinamide", "shea butter")),
    _Category("makeup", "Beauty & Personal Care › Makeup",
              ("lipstick", "foundation", "mascara", "eyeshadow palette", "concealer"), "", "{type}",
              ("long lasting", "waterproof", "highly pigmented", "cruelty free", "vegan formula", "easy apply",
               "travel size", "smudge proof", "matte finish"),
              (("color", _SHADES),), (5, 50), ("mineral", "cream", "powder")),
    _Category("nail care", "Beauty & Personal Care › Foot, Hand & Nail Care",
              ("nail polish", "nail drill", "press on nails", "nail file", "cuticle oil"), "", "{type}",
              ("long lasting", "quick dry", "non toxic", "easy use", "salon quality", "high quality", "gel polish"),
              (("color", _COLORS), ("size", _PACKS)), (5, 60), ("glass", "gel", "acrylic")),
    _Category("fragrance", "Beauty & Personal Care › Fragrance",
              ("eau de parfum", "body mist", "cologne", "perfume oil"), "", "{type}",
              ("long lasting", "travel size", "alcohol free", "natural ingredients", "fresh scent", "gift set"),
              (("size", _FL_OZ), ("scent", _SCENTS)), (10, 150), ("floral", "woody", "musk")),
    _Category("oral care", "Health & Household › Oral Care",
              ("toothpaste", "electric toothbrush", "water flosser", "mouthwash", "whitening strips"), "", "{type}",
              ("fluoride free", "sensitive teeth", "teeth whitening", "fresh breath", "rechargeable",
               "long lasting", "travel size", "alcohol free"),
              (("flavor name", ("mint", "cinnamon", "charcoal", "spearmint", "wintergreen")), ("size", _PACKS)),
              (4, 120), ("charcoal", "xylitol", "baking soda")),
    _Category("women's shoes", "Clothing, Shoes & Jewelry › Women › Shoes",
              ("sneakers", "sandals", "ankle boots", "ballet flats", "slippers"), "for women", "women's {type}",
              ("non slip", "rubber sole", "memory foam", "lightweight", "arch support", "slip on", "closed toe",
               "open toe", "breathable mesh", "wide width"),
              (("color", _COLORS), ("size", _W_SHOES)), (20, 120), ("suede", "leather", "mesh", "canvas")),
    _Category("men's shoes", "Clothing, Shoes & Jewelry › Men › Shoes",
              ("running shoes", "loafers", "work boots", "hiking boots", "slides"), "for men", "men's {type}",
              ("non slip", "rubber sole", "steel toe", "water resistant", "lightweight", "arch support", "slip on",
               "leather sole", "memory foam"),
              (("color", _COLORS), ("size", _M_SHOES)), (25, 160), ("leather", "mesh", "nubuck", "knit")),
    _Category("women's clothing", "Clothing, Shoes & Jewelry › Women › Clothing",
              ("t-shirt", "cardigan", "maxi dress", "leggings", "blouse"), "for women", "women's {type}",
              ("machine wash", "long sleeve", "short sleeve", "high waist", "button closure", "polyester spandex",
               "hand wash", "relaxed fit", "soft material", "tummy control"),
              (("color", _COLORS), ("size", _APPAREL)), (12, 70), ("cotton", "rayon", "chiffon", "modal")),
    _Category("men's clothing", "Clothing, Shoes & Jewelry › Men › Clothing",
              ("polo shirt", "hoodie", "cargo shorts", "jeans", "dress shirt"), "for men", "men's {type}",
              ("machine wash", "regular fit", "slim fit", "cotton spandex", "button closure", "long sleeve",
               "short sleeve", "elastic waistband", "quick drying"),
              (("color", _COLORS), ("size", _APPAREL)), (15, 90), ("cotton", "denim", "fleece", "linen")),
    _Category("jewelry", "Clothing, Shoes & Jewelry › Women › Jewelry",
              ("necklace", "earrings", "bracelet", "ring", "anklet"), "for women", "{type} for women",
              ("sterling silver", "gold plated", "hypoallergenic", "adjustable", "gift box", "nickel free",
               "cubic zirconia"),
              (("color", _METAL),), (10, 200), ("pearl", "crystal", "opal")),
    _Category("bags", "Clothing, Shoes & Jewelry › Luggage & Travel Gear",
              ("backpack", "crossbody bag", "tote bag", "wallet", "duffel bag"), "", "{type}",
              ("water resistant", "large capacity", "zipper closure", "vegan leather", "anti theft",
               "adjustable strap", "multiple pockets"),
              (("color", _COLORS),), (15, 120), ("nylon", "canvas", "leather")),
    _Category("snacks", "Grocery & Gourmet Food › Snack Foods",
              ("protein bars", "potato chips", "mixed nuts", "beef jerky", "granola"), "", "{type}",
              ("gluten free", "low carb", "high protein", "non gmo", "keto friendly", "low sugar", "plant based",
               "individually wrapped", "sugar free", "low calorie"),
              (("flavor name", _SNACK_FLAVORS), ("size", _PACKS)), (4, 45), ("almond", "oat", "whey")),
    _Category("beverages", "Grocery & Gourmet Food › Beverages",
              ("green tea", "coffee beans", "sparkling water", "herbal tea", "cold brew"), "", "{type}",
              ("caffeine free", "organic", "sugar free", "non gmo", "low calorie", "whole bean", "decaf",
               "fair trade", "zero sugar"),
              (("flavor name", _DRINK_FLAVORS), ("size", _PACKS)), (5, 50), ("arabica", "matcha", "chamomile")),
    _Category("pantry", "Grocery & Gourmet Food › Pantry Staples",
              ("olive oil", "pasta sauce", "honey", "almond flour", "maple syrup"), "", "{type}",
              ("gluten free", "organic", "non gmo", "kosher", "no artificial flavors", "low sodium",
               "keto friendly", "sugar free"),
              (("size", _OUNCES),), (4, 40), ("extra virgin", "raw", "stone ground")),
    _Category("candy", "Grocery & Gourmet Food › Candy & Chocolate",
              ("dark chocolate", "gummy candy", "hard candy", "chocolate truffles", "lollipops"), "", "{type}",
              ("gluten free", "individually wrapped", "sugar free", "kosher", "valentine day", "gift basket",
               "birthday party", "dairy free"),
              (("flavor name", _SNACK_FLAVORS[:4] + ("strawberry", "mixed fruit", "caramel")), ("size", _OUNCES)),
              (3, 40), ("cocoa", "fruit", "caramel")),
    _Category("living room furniture", "Home & Kitchen › Furniture › Living Room Furniture",
              ("coffee table", "sofa", "accent chair", "tv stand", "bookshelf"), "", "{type}",
              ("easy assembly", "solid wood", "mid century", "storage space", "living room", "metal legs",
               "space saving", "high density"),
              (("color", _WOOD),), (60, 600), ("oak", "velvet", "rattan", "steel")),
    _Category("bedding", "Home & Kitchen › Bedding",
              ("comforter set", "sheet set", "bed pillows", "mattress topper", "weighted blanket"), "", "{type}",
              ("machine washable", "soft microfiber", "breathable", "cooling", "hypoallergenic", "deep pocket",
               "memory foam", "all season"),
              (("size", _BED), ("color", _COLORS)), (20, 180), ("microfiber", "cotton", "bamboo")),
    _Category("kitchen", "Home & Kitchen › Kitchen & Dining",
              ("frying pan", "knife set", "cutting board", "coffee mug", "food storage containers"), "", "{type}",
              ("dishwasher safe", "non stick", "stainless steel", "bpa free", "easy clean", "heat resistant",
               "microwave safe", "oven safe"),
              (("color", _COLORS), ("size", _PACKS)), (8, 120), ("ceramic", "bamboo", "cast iron", "glass")),
    _Category("home decor", "Home & Kitchen › Home Décor",
              ("wall art", "throw pillow covers", "area rug", "curtains", "table lamp"), "", "{type}",
              ("living room", "bedroom", "easy install", "ready hang", "machine washable", "blackout",
               "non slip", "modern style"),
              (("color", _COLORS), ("size", _ROOM)), (12, 250), ("canvas", "linen", "jute", "velvet")),
    _Category("bath", "Home & Kitchen › Bath",
              ("bath towels", "shower curtain", "bath mat", "towel rack", "soap dispenser"), "", "{type}",
              ("quick drying", "highly absorbent", "machine washable", "non slip", "rust proof", "easy install"),
              (("color", _COLORS), ("size", _PACKS)), (10, 80), ("cotton", "stainless steel", "bamboo")),
    _Category("cleaning", "Health & Household › Household Supplies",
              ("laundry detergent", "dish soap", "all purpose cleaner", "spin mop", "scrub sponges"), "", "{type}",
              ("plant based", "fragrance free", "biodegradable", "long lasting", "heavy duty", "easy use"),
              (("scent", _SCENTS), ("size", _PACKS)), (5, 60), ("enzyme", "citrus oil", "microfiber")),
    _Category("audio", "Electronics › Headphones & Speakers",
              ("wireless earbuds", "bluetooth speaker", "headphones", "soundbar", "portable radio"), "", "{type}",
              ("noise cancelling", "long battery life", "water resistant", "fast charging", "hands free",
               "high fidelity", "usb c", "built in microphone"),
              (("color", _COLORS),), (20, 300), ("aluminum", "silicone")),
    _Category("phone accessories", "Cell Phones & Accessories",
              ("phone case", "screen protector", "charging cable", "power bank", "car mount"), "", "{type}",
              ("shockproof", "fast charging", "tempered glass", "wireless charging", "easy install", "high speed",
               "slim fit", "scratch resistant"),
              (("color", _COLORS), ("style", _PHONES)), (6, 60), ("silicone", "tpu", "nylon braided")),
    _Category("computer accessories", "Electronics › Computers & Accessories",
              ("wireless mouse", "mechanical keyboard", "laptop stand", "usb hub", "webcam"), "", "{type}",
              ("ergonomic design", "plug play", "usb c", "rgb backlit", "adjustable height", "high speed",
               "aluminum alloy", "quiet click"),
              (("color", _COLORS[:4]),), (12, 150), ("aluminum", "abs plastic")),
    _Category("cameras", "Electronics › Camera & Photo",
              ("security camera", "action camera", "ring light", "tripod", "dash cam"), "", "{type}",
              ("night vision", "motion detection", "4k ultra hd", "easy install", "two way audio", "remote control",
               "waterproof", "wide angle"),
              (("size", _PACKS[:4]),), (20, 250), ("aluminum", "metal")),
    _Category("sports", "Sports & Outdoors › Exercise & Fitness",
              ("yoga mat", "dumbbells", "resistance bands", "water bottle", "jump rope"), "", "{type}",
              ("non slip", "eco friendly", "bpa free", "lightweight", "easy carry", "high density", "leak proof",
               "double wall"),
              (("color", _COLORS), ("size", ("small", "medium", "large"))), (8, 90), ("tpe", "neoprene", "steel")),
    _Category("pet supplies", "Pet Supplies",
              ("dog bed", "cat litter", "dog treats", "pet shampoo", "cat toy"), "", "{type}",
              ("machine washable", "grain free", "natural ingredients", "non slip", "easy clean", "odor control"),
              (("size", _PET), ("flavor name", _PET_FLAVORS)), (6, 90), ("orthopedic foam", "clay", "oatmeal")),
    _Category("baby", "Baby",
              ("diapers", "baby wipes", "baby bottle", "swaddle blanket", "teething toy"), "", "{type}",
              ("fragrance free", "bpa free", "hypoallergenic", "soft material", "sensitive skin", "easy clean"),
              (("size", _BABY),), (8, 70), ("muslin", "silicone", "cotton")),
    _Category("vitamins", "Health & Household › Vitamins & Dietary Supplements",
              ("multivitamin", "fish oil", "probiotic", "melatonin gummies", "protein powder"), "", "{type}",
              ("gluten free", "non gmo", "sugar free", "vegan", "third party tested", "easy swallow",
               "immune support", "high potency"),
              (("flavor name", ("unflavored", "berry", "lemon", "chocolate", "vanilla")), ("size", _COUNTS)),
              (8, 70), ("omega 3", "zinc", "vitamin d3")),
)  # fmt: skip

_SYLLABLES = (
    "vel", "nor", "ka", "lu", "tri", "zen", "mo", "ra", "bel", "sto", "qui", "dar", "fen", "ix", "sol", "ta",
    "ver", "ona", "pel", "rix", "ama", "cor", "dun", "eli", "fa", "gro", "hav", "ji", "lin", "mar",
)  # fmt: skip
_BRANDS_PER_CATEGORY = 10
_STYLE_WORDS = ("Premium", "Classic", "Essential", "Ultra", "Everyday", "Pro", "Deluxe", "Original", "Signature")
_OPENERS = ("i need", "i am looking for", "i want", "find me", "i would like", "i'm looking for", "get me")
_REVIEWS = (
    ("5", "Love it", "Exactly as described, great {type}."),
    ("5", "Great value", "Works really well for the price. Would buy again."),
    ("4", "Pretty good", "Good quality {type}, shipping was a bit slow."),
    ("3", "It's okay", "Does the job but not as {attr} as I hoped."),
    ("2", "Disappointed", "The {type} arrived damaged and the color was off."),
    ("1", "Not for me", "Returned it after a week."),
)


def _brands(rng: random.Random) -> list[list[str]]:
    seen: set[str] = set()
    out = []
    for _ in _CATEGORIES:
        names = []
        while len(names) < _BRANDS_PER_CATEGORY:
            name = "".join(rng.sample(_SYLLABLES, rng.choice((2, 2, 3)))).capitalize()
            if name not in seen:
                seen.add(name)
                names.append(name)
        out.append(names)
    return out


def _plural(noun_phrase: str) -> bool:
    last = noun_phrase.split()[-1]
    return last.endswith("s") and not last.endswith("ss")


def _a(phrase: str, head: str | None = None) -> str:
    """``phrase`` with "a"/"an" in front, unless its head noun (default: its last word) is plural."""
    if _plural(head or phrase):
        return phrase
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _join_and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _price(rng: random.Random, lo: float, hi: float) -> tuple[float, str]:
    """A fixed price and its tag; one product in five shows a range and its price is drawn inside it."""
    base = round(rng.uniform(lo, hi)) - 0.01 if hi > 5 else round(rng.uniform(lo, hi), 2)
    base = max(base, 0.99)
    if rng.random() < 0.2:
        top = round(base * rng.uniform(1.2, 2.0)) - 0.01
        price = round(rng.uniform(base, top), 2)
        return price, f"${base:.2f} to ${top:.2f}"
    return base, f"${base:.2f}"


def _make_product(i: int, rng: random.Random, brands: list[list[str]], asins: set[str]) -> tuple[Product, int]:
    cat_i = i % len(_CATEGORIES)
    cat = _CATEGORIES[cat_i]
    ptype = rng.choice(cat.types)
    brand = rng.choice(brands[cat_i])
    attrs = tuple(rng.sample(cat.attributes, rng.randint(3, min(5, len(cat.attributes)))))
    material = rng.choice(cat.materials) if cat.materials else ""
    while True:
        asin = "B0" + "".join(rng.choices("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=8))
        if asin not in asins:
            asins.add(asin)
            break

    title = f"{brand} {rng.choice(_STYLE_WORDS)} {ptype.title()}"
    if cat.audience:
        title += f" {cat.audience.title()}"
    title_attrs = [a.title() for a in attrs[: rng.randint(0, 2)]]
    if title_attrs:
        title += " - " + ", ".join(title_attrs)
    if material and rng.random() < 0.5:
        title += f", {material.title()}"

    bullets = [
        f"{attrs[0].upper()}: {'these' if _plural(ptype) else 'this'} {ptype} {'are' if _plural(ptype) else 'is'} "
        f"{attrs[0]} and made to last.",
        f"QUALITY MATERIAL: made with {material or 'premium materials'}; {attrs[1]} for everyday use.",
        f"DESIGN: {_join_and(list(attrs[2:]))}, so it fits your routine.",
        f"WHAT YOU GET: {_a(ptype)} from {brand}, backed by a 30-day hassle-free return policy.",
    ]
    if rng.random() < 0.5:
        bullets.append(f"PERFECT GIFT: {_a(ptype)} {cat.audience or 'for family and friends'}.".replace("  ", " "))
    description = (
        f"The {brand} {ptype} is designed for people who care about quality. "
        f"{attrs[0].capitalize()} and {attrs[-1]}, it is {rng.choice(('a great choice', 'an easy pick', 'ideal'))} "
        f"for {rng.choice(('daily use', 'home and travel', 'gifting', 'any season'))}."
    )

    options: list[tuple[str, tuple[str, ...]]] = []
    used: set[str] = set()
    for name, pool in cat.options:
        if rng.random() < 0.15 and options:
            continue  # some products of the category lack the group, like real listings
        k = rng.randint(2, min(5, len(pool)))
        picked = sorted(rng.sample(range(len(pool)), k))
        values = tuple(pool[j] for j in picked if pool[j] not in used)
        if values:
            used.update(values)
            options.append((name, values))
    if rng.random() < 0.1:
        options = []  # and some have no options at all

    price, tag = _price(rng, *cat.price)
    rating = "N.A." if rng.random() < 0.3 else f"{rng.uniform(3.0, 5.0):.1f}"
    reviews = tuple(
        (score, head, body.format(type=ptype, attr=attrs[0]))
        for score, head, body in rng.sample(_REVIEWS, rng.randint(0, 3))
    )
    product = Product(
        asin=asin,
        title=title,
        category=cat.key,
        product_category=f"{cat.path} › {ptype.title()}",
        query=cat.query_fmt.format(type=ptype),
        bullets=tuple(bullets),
        description=description,
        attributes=attrs,
        options=tuple(options),
        price=price,
        price_tag=tag,
        rating=rating,
        reviews=reviews,
        brand=brand,
        product_type=ptype,
    )
    return product, cat_i


def _product_goals(index: int, product: Product, cat: _Category, rng: random.Random) -> list[Goal]:
    goal_attrs = tuple(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
    thing = product.product_type + (f" {cat.audience}" if cat.audience else "")
    base = f"{rng.choice(_OPENERS)} {_a(_join_and(list(goal_attrs)) + ' ' + thing, product.product_type)}"
    upper = price_upper_for(product.price, rng)
    names = sorted(name for name, _ in product.options)
    groups = dict(product.options)
    combos = list(itertools.product(*(groups[n] for n in names)))
    if len(combos) > GOALS_PER_PRODUCT:
        combos = rng.sample(combos, GOALS_PER_PRODUCT)
    goals = []
    for combo in combos:
        opts = tuple(zip(names, combo, strict=True))
        text = base + option_text(opts) + price_text(upper)
        goals.append(Goal(index, text, goal_attrs, opts, upper))
    return goals


def generate_catalogue(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = DEFAULT_SEED) -> Catalogue:
    """The generated catalogue of ``num_products`` products, deterministic in both arguments."""
    if num_products < 1:
        raise ValueError(f"num_products={num_products} must be >= 1")
    rng = random.Random(f"webshop-lite/{CATALOGUE_VERSION}/{seed}")
    brands = _brands(rng)
    asins: set[str] = set()
    products, goals = [], []
    for i in range(num_products):
        product, cat_i = _make_product(i, rng, brands, asins)
        products.append(product)
        goals.extend(_product_goals(i, product, _CATEGORIES[cat_i], rng))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    lexicon: set[str] = set()
    for cat in _CATEGORIES:
        for ptype in cat.types:
            lexicon.update(tokens(ptype))
        lexicon.update(w for w in tokens(cat.audience) if w != "for")
    for names in brands:
        lexicon.update(n.lower() for n in names)
    lexicon -= _FUNCTION_WORDS  # "all" (all purpose cleaner), "for" ...
    return Catalogue(products, goals, noun_lexicon=lexicon, source=f"generated:{num_products}:{seed}")


@functools.lru_cache(maxsize=4)
def default_catalogue(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = DEFAULT_SEED) -> Catalogue:
    """`generate_catalogue`, once per process and argument pair."""
    return generate_catalogue(num_products, seed)
