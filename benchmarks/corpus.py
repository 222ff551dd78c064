"""Reproducible synthetic Korean/English chat corpus for latency benchmarks.

Why this exists: latency numbers for a memory engine are only comparable
across machines and commits if every run ingests *the same* messages, and
they are only meaningful if those messages look like what the engine will
really see — short, noisy Discord-style chat in Korean, English and a mix of
the two ("오늘 deploy 했어?").  Real chat logs cannot be shipped with the
repository, so this module builds messages combinatorially from many
templates and slot vocabularies:

* everything is driven by a private ``random.Random(seed)`` so the output is
  a pure function of ``(n, seed)`` and never touches global random state;
* the template × vocabulary space is large enough that at 100k messages
  almost all texts are distinct (duplicate texts would make index sizes and
  dedup paths unrealistically cheap);
* Korean particles (이/가, 은/는, 을/를, 으로/로, ...) are chosen from the
  final syllable of the word they attach to, so tokenisers and morphological
  analysers see grammatical Korean rather than template artefacts;
* queries come from a disjoint set of question templates that talk about the
  same topics, so retrieval has something to find but can never win by exact
  string match.

Only the standard library is used so the benchmark can run before any optional
dependency is installed.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["ChatMessage", "generate_messages", "generate_queries"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One synthetic chat message.

    Frozen so a generated corpus can be shared between benchmark phases
    without one phase mutating what the next one measures.
    """

    text: str
    speaker: str
    channel: str  # e.g. "general", "dev", "게임", "잡담" ... about 20 channels
    guild: str  # 3-4 guilds
    language: str  # "ko" | "en"
    timestamp: float  # unix seconds, increasing within the corpus


# ---------------------------------------------------------------------------
# Korean particle (josa) selection
# ---------------------------------------------------------------------------

_HANGUL_FIRST = 0xAC00
_HANGUL_LAST = 0xD7A3
_JONG_RIEUL = 8  # ㄹ final consonant index

# Final consonant of the Korean reading of a trailing digit / Latin letter.
# Only what matters for particle choice: 0 = open syllable, 8 = ㄹ, other = closed.
_NON_HANGUL_JONG = {
    "0": 21, "1": 8, "3": 16, "6": 1, "7": 8, "8": 8,  # 영 일 삼 육 칠 팔
    "l": 8, "m": 16, "n": 4,  # Daniel→대니얼, Sam→샘, Ethan→이선
}

# spec -> (after closed syllable, after open syllable)
_JOSA: dict[str, tuple[str, str]] = {
    "가": ("이", "가"),
    "는": ("은", "는"),
    "를": ("을", "를"),
    "와": ("과", "와"),
    "랑": ("이랑", "랑"),
    "나": ("이나", "나"),
    "야": ("아", "야"),
    "이래": ("이래", "래"),
    "이야": ("이야", "야"),
    "로": ("으로", "로"),
}


def _final_consonant(word: str) -> int:
    """Return the jongseong index of the word's last sound (0 when open)."""
    if not word:
        return 0
    ch = word[-1]
    code = ord(ch)
    if _HANGUL_FIRST <= code <= _HANGUL_LAST:
        return (code - _HANGUL_FIRST) % 28
    return _NON_HANGUL_JONG.get(ch.lower(), 0)


def _josa(word: str, spec: str) -> str:
    pair = _JOSA.get(spec)
    if pair is None:  # unknown spec: treat it as a literal invariant suffix (에서, 한테, 도 ...)
        return spec
    jong = _final_consonant(word)
    if spec == "로":
        return "로" if jong in (0, _JONG_RIEUL) else "으로"
    return pair[0] if jong else pair[1]


class _W(str):
    """A vocabulary word that knows how to attach a Korean particle.

    ``"{name:가}".format_map(...)`` calls ``__format__`` with spec ``"가"``, so
    templates can say ``{name:가}`` and get 민지가 / 지훈이 / Sam이 correctly.
    """

    __slots__ = ()

    def __format__(self, spec: str) -> str:
        if not spec:
            return str.__str__(self)
        return str.__str__(self) + _josa(self, spec)


class _Slots(dict):
    """Lazy slot filler: each ``{slot}`` is drawn the first time it is used.

    ``{food_ko2}`` draws from the ``food_ko`` vocabulary but independently of
    ``{food_ko}`` (re-rolled a few times to avoid "A or A" sentences), and
    ``{name}`` never resolves to the speaker of the message.
    """

    __slots__ = ("_rng", "_speaker", "_vocab")

    def __init__(self, rng: random.Random, vocab: dict[str, list[_W]], speaker: str = "") -> None:
        super().__init__()
        self._rng = rng
        self._vocab = vocab
        self._speaker = speaker

    def __missing__(self, key: str) -> _W:
        base = key.rstrip("0123456789")
        words = self._vocab[base]
        value = self._rng.choice(words)
        if base != key:
            for _ in range(3):
                if value not in self.values():
                    break
                value = self._rng.choice(words)
        if base == "name":  # people rarely address or mention themselves
            while value == self._speaker:
                value = self._rng.choice(words)
        self[key] = value
        return value


def _words(text: str) -> list[_W]:
    """Split a ``|``-separated vocabulary string into wrapped words."""
    return [_W(w.strip()) for w in text.split("|") if w.strip()]


def _endings(text: str) -> list[_W]:
    """Like :func:`_words` but keeps leading spaces (" 사람?" vs "래?")."""
    return [_W(w) for w in text.split("|") if w]


# ---------------------------------------------------------------------------
# Speakers, guilds, channels
# ---------------------------------------------------------------------------

_KO_NAMES = ["민지", "서연", "지훈", "도윤", "하은", "예준", "수아", "지우", "현우", "유나",
             "준호", "소연", "태민", "은비", "재원", "나연", "성민", "다은", "승우", "혜진"]
_EN_NAMES = ["Alex", "Sam", "Jordan", "Emily", "Chris", "Taylor", "Mia", "Ethan", "Olivia", "Noah",
             "Grace", "Ryan", "Chloe", "Daniel", "Sophie", "Jake", "Hannah", "Leo", "Nina", "Max"]
_SPEAKER_LANG: dict[str, str] = {**{n: "ko" for n in _KO_NAMES}, **{n: "en" for n in _EN_NAMES}}

# guild -> (channels with relative activity weight, topic bias per channel)
_GUILDS: dict[str, list[tuple[str, int, tuple[str, ...]]]] = {
    "seoul-devs": [
        ("general", 5, ("greeting", "smalltalk", "work")),
        ("dev", 6, ("coding",)),
        ("backend", 3, ("coding", "work")),
        ("frontend", 2, ("coding",)),
        ("커리어", 2, ("work", "study")),
        ("random", 3, ("smalltalk", "food", "shopping")),
    ],
    "밤샘 게임단": [
        ("게임", 6, ("game",)),
        ("lol", 3, ("game",)),
        ("valorant", 2, ("game",)),
        ("잡담", 5, ("smalltalk", "food", "media")),
        ("음악", 2, ("media",)),
    ],
    "study-together": [
        ("study", 4, ("study",)),
        ("공부방", 3, ("study", "health")),
        ("reading-club", 2, ("media",)),
        ("질문", 2, ("study", "coding")),
    ],
    "동네 친구들": [
        ("잡담", 5, ("smalltalk", "greeting", "plans")),
        ("맛집", 3, ("food",)),
        ("여행", 3, ("travel", "weather")),
        ("pets", 3, ("pets",)),
        ("운동", 2, ("health",)),
        ("약속", 2, ("plans", "food")),
    ],
}


def _guild_members() -> dict[str, list[str]]:
    """Fixed, overlapping member lists so each guild has its own regulars.

    Derived from a dedicated RNG so membership never depends on the
    generation seed (the same people are always in the same guilds).
    """
    rng = random.Random(20260101)
    members: dict[str, list[str]] = {}
    for guild in _GUILDS:
        ko = rng.sample(_KO_NAMES, 9)
        en = rng.sample(_EN_NAMES, 9)
        members[guild] = ko + en
    return members


_MEMBERS = _guild_members()

# ---------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------

_VOCAB: dict[str, list[_W]] = {
    "name": [_W(n) for n in _KO_NAMES + _EN_NAMES],
    # ---- Korean side --------------------------------------------------
    "hi_ko": _words("안녕|하이|ㅎㅇ|안녕하세요|하이하이|다들 안녕|굿모닝|좋은 아침|오랜만|ㅎㅇㅎㅇ"),
    "time_past_ko": _words(
        "어제|아까|방금|지난 주말에|저번 주에|오늘 점심에|어젯밤에|주말에|오늘 아침에|"
        "퇴근길에|새벽에|그저께|지난달에|연휴 때|점심시간에|금요일에"
    ),
    "time_fut_ko": _words(
        "내일|이번 주말에|다음 주에|금요일에|이따가|퇴근하고|모레|연휴에|다음 달에|"
        "토요일에|일요일 저녁에|오늘 밤에|내일 점심에|이번 주 안에|수업 끝나고|월요일에"
    ),
    "deadline_ko": _words("내일|금요일|이번 주|월요일 오전|오늘 밤|모레|다음 주 화요일|점심 전"),
    "date_ko": _words(
        "3월 14일|다음 주 금요일|5월 2일|이번 주 토요일|12월 24일|7월 7일|"
        "8월 15일|10월 3일|다음 달 초|1월 9일|6월 21일|11월 11일"
    ),
    "hour_ko": _words("7시|8시 반|9시|10시|11시|6시|12시|새벽 2시|오후 3시|저녁 7시 반|1시|5시"),
    "dur_ko": _words("2시간|3시간 반|1시간|40분|2시간 반|5시간|20분|하루 종일"),
    "nights_ko": _words("1박 2일|2박 3일|3박 4일|당일치기|4박 5일"),
    "price_ko": _words("만 원|3만 원|5천 원|12만 원|20만 원|150만 원|2만 5천 원|8천 원|45만 원|9900원"),
    "num_ko": _words("2|3|5|7|10|12|15|20|30|40"),
    "small_ko": _words("2|3|4|5|한 4|겨우 3"),
    "food_ko": _words(
        "떡볶이|김치찌개|된장찌개|삼겹살|치킨|피자|짜장면|짬뽕|라멘|초밥|마라탕|냉면|"
        "국밥|순대국|부대찌개|햄버거|샐러드|파스타|쌀국수|제육볶음|돈까스|김밥|곱창|"
        "족발|보쌈|회|샌드위치|카레|우동|탕수육|닭갈비|칼국수|비빔밥|감자탕|훠궈|타코|"
        "양꼬치|붕어빵|호떡|빙수|마카롱|돼지국밥|밀면|물회|육회|포케|순두부찌개|짜파게티"
    ),
    "drink_ko": _words("아아|라떼|맥주|소주|하이볼|밀크티|에이드|콜라|녹차|막걸리|와인|제로콜라"),
    "spot_ko": _words(
        "홍대|강남역|성수동|한강공원|코엑스|을지로|이태원|망원동|연남동|잠실|"
        "신촌|건대|판교|서울숲|익선동|여의도|합정|광화문|부평|해방촌"
    ),
    "spot_study_ko": _words("도서관|스카|카페|학교|독서실|집 앞 카페|스터디룸"),
    "act_plan_ko": _words(
        "노래방|방탈출 카페|보드게임 카페|전시회|팝업 스토어|볼링장|찜질방|콘서트|"
        "영화관|PC방|플리마켓|야구장"
    ),
    "city_ko": _words(
        "부산|제주도|강릉|경주|여수|전주|속초|대구|광주|대전|도쿄|오사카|후쿠오카|"
        "방콕|다낭|타이베이|홍콩|파리|뉴욕|통영|양양|춘천"
    ),
    "game_ko": _words(
        "롤|발로란트|배그|메이플|오버워치|마크|엘든링|젤다|스타듀밸리|원신|로아|피파|"
        "포켓몬|동물의 숲|테트리스|디아블로|몬헌|팰월드|발더스게이트|철권|스팀 신작|Balatro"
    ),
    "rank_ko": _words("골드|플래티넘|다이아|브론즈|실버|에메랄드|마스터|챌린저|불멸|레디언트"),
    "game_op_ko": _words(
        "밸런스 망했던데|너프 너무 심하다|이번엔 괜찮은 듯|버그 투성이임|신캐 개사기임|"
        "맵 바뀐 거 좋더라|과금 유도 심해짐|서버 터졌더라|그냥 그럼|역대급인 듯"
    ),
    "work_ko": _words(
        "회의|야근|출장|보고서|발표|면접|회식|연봉 협상|재택|온보딩|분기 리뷰|"
        "스프린트 회고|데모|워크숍|1on1|고객 미팅|주간 보고|코드 프리즈"
    ),
    "company_ko": _words(
        "카카오|네이버|토스|쿠팡|배민|라인|당근|삼성|스타트업 한 군데|외국계 회사|"
        "게임 회사|핀테크 회사|에이전시|구글 코리아|스타트업"
    ),
    "result_ko": _words(
        "붙었어!!|떨어졌어 ㅠㅠ|결과 아직 안 나옴|2차까지 갔어|최종 합격했다|"
        "다음 주에 결과 나온대|서류는 붙었음|탈락이래 ㅠ|오퍼 받았어"
    ),
    "tech_act_ko": _words("배포|deploy|머지|merge|리팩토링|롤백|코드 리뷰|핫픽스|빌드|릴리즈|테스트|마이그레이션"),
    "tech_ko": _words(
        "로그인 API|결제 모듈|알림 서버|DB 스키마|CI 파이프라인|검색 기능|캐시 레이어|"
        "프론트 빌드|도커 이미지|인증 로직|크롤러|대시보드|어드민 페이지|배치 잡|"
        "웹소켓 서버|회원가입 폼|추천 API|로깅 설정|k8s 설정|모바일 앱"
    ),
    "bug_ko": _words(
        "로그인 안 되는 버그|타임아웃 에러|null 에러|무한 로딩|메모리 누수|CORS 에러|"
        "빌드 깨지는 거|테스트 실패|레이스 컨디션|인코딩 깨지는 거|500 에러|데드락|"
        "시간대 버그|캐시 안 비워지는 거|중복 결제 버그"
    ),
    "lang_ko": _words("파이썬|노드|리액트|스프링|타입스크립트|Go|Rust|Django|Next.js|코틀린|FastAPI|Vue"),
    "pet_ko": _words("고양이|강아지|햄스터|앵무새|거북이|토끼|고슴도치|금붕어"),
    "pet_name": _words(
        "나비|보리|콩이|두부|모찌|초코|루이|코코|밤이|감자|호두|망고|치즈|별|레오|미미|"
        "솜|까미|짱구|쿠키|Mochi|Luna|Milo|Pepper"
    ),
    "vet_ko": _words("괜찮대|살 좀 빼야 된대|예방접종 맞았어|이빨 하나 뽑았어|완전 건강하대|장염이래|중성화 잘 끝났어"),
    "pet_act_ko": _words(
        "밥을 다 먹었어|소파를 다 긁어놨어|하루 종일 잤어|택배 상자에 들어갔어|"
        "간식 달라고 계속 울어|산책 가자고 난리야|내 양말 물어갔어|처음으로 손 줬어|"
        "캣타워에서 안 내려와|목욕하고 삐졌어"
    ),
    "weather_ko": _words(
        "비가 엄청 와|눈 온다|너무 더워|진짜 추워|미세먼지 심해|날씨 완전 좋아|"
        "바람 엄청 불어|습해서 죽겠어|하늘 진짜 맑다|안개 꼈어|우박 떨어짐|벚꽃 폈더라"
    ),
    "weather_fut_ko": _words("비 온대|눈 온대|엄청 춥대|폭염이래|태풍 온대|황사 심하대|날씨 풀린대|장마 시작이래"),
    "study_ko": _words(
        "토익|정처기|알고리즘|통계학|일본어|중간고사|기말고사|졸업 논문|코딩 테스트|"
        "자료구조|운영체제|영어 회화|한국사|선형대수|머신러닝 강의|SQLD|오픽|회계원리"
    ),
    "score_ko": _words("850점|900점|70점|A+|B0|만점|합격|IM2|AL|95점|턱걸이로 통과|재시험"),
    "item_ko": _words(
        "기계식 키보드|새 모니터|그래픽카드|아이패드|에어팟|노트북|사무용 의자|무선 마우스|"
        "닌텐도 스위치|카메라|운동화|패딩|텀블러|스마트워치|4090|맥북|공기청정기|전기자전거"
    ),
    "media_ko": _words(
        "오징어 게임|듄|인터스텔라|나의 아저씨|범죄도시|흑백요리사|무빙|더 글로리|원피스|"
        "귀멸의 칼날|주술회전|스파이더맨|인사이드 아웃|슬램덩크|어벤져스|파묘|눈물의 여왕|"
        "선재 업고 튀어|체인소맨|프리렌"
    ),
    "book_ko": _words(
        "데미안|채식주의자|아몬드|불편한 편의점|사피엔스|클린 코드|달러구트 꿈 백화점|"
        "소년이 온다|어린 왕자|총균쇠|코스모스|미움받을 용기|파친코|트렌드 코리아|"
        "작별하지 않는다|리팩터링"
    ),
    "music_ko": _words(
        "아이유|뉴진스|세븐틴|에스파|BTS|르세라핌|데이식스|잔나비|아이브|검정치마|"
        "QWER|혁오|태연|투바투|NCT|실리카겔"
    ),
    "opinion_ko": _words("재밌어|별로야|미쳤어|눈물 났어|지루해|"
                         "기대 이상이야|그냥 그래|역대급이야|너무 길어|좀 아쉬워"),
    "book_op_ko": _words(
        "생각보다 술술 읽혀|좀 어렵다|진짜 좋아|반쯤 읽었는데 벌써 여운 남음|"
        "밑줄 엄청 치는 중|잠 안 올 때 딱이야|번역이 좀 아쉬움"
    ),
    "exercise_ko": _words("헬스|러닝|수영|필라테스|클라이밍|요가|자전거|등산|배드민턴|테니스|볼링|축구|크로스핏"),
    "feel_ko": _words(
        "피곤해|졸려|배고파|행복해|심심해|스트레스 받아|기분 좋아|멘탈 나갔어|신나|"
        "우울해|설레|현타 와|뿌듯해|정신없어"
    ),
    "react_ko": _words(
        "ㅋㅋㅋ|ㅋㅋㅋㅋㅋ|ㅎㅎ|ㅠㅠ|ㄹㅇ|헐|대박|와|ㄷㄷ|ㅇㅈ|미쳤다|ㅋㅋㅋㅋ 미쳤네|"
        "오 좋다|아 진짜?|레전드|ㅜㅜ|굿굿|ㄱㅇㄷ|에바야|ㅇㅋ|오키|실화냐"
    ),
    # ---- English side -------------------------------------------------
    "hi_en": _words("hey|hi|yo|morning|hello|sup|heyy|hiya|good morning|evening"),
    "time_past_en": _words(
        "yesterday|this morning|last night|last weekend|earlier|on Friday|last week|"
        "at lunch|just now|over the holidays|on the way home|two days ago"
    ),
    "time_fut_en": _words(
        "tomorrow|this weekend|next week|on Friday|tonight|after work|later today|"
        "on Saturday|next month|Sunday night|after class|on Monday|over the long weekend"
    ),
    "deadline_en": _words("tomorrow|Friday|end of week|Monday morning|tonight|Tuesday|noon"),
    "date_en": _words(
        "March 14|next Friday|May 2|this Saturday|Dec 24|July 7|Aug 15|Oct 3|"
        "early next month|Jan 9|June 21|Nov 11"
    ),
    "hour_en": _words("7|8:30|9|10|11|6|noon|2am|3pm|7:30|1am|5"),
    "dur_en": _words("2 hours|like 3 hours|an hour|40 minutes|half a day|5 hours|20 minutes|all day"),
    "trip_en": _words("a long weekend|a week|3 nights|two weeks|a day trip|5 days"),
    "price_en": _words("$12|$40|$5|$120|$200|$1500|$25|$8|$450|$99"),
    "num_en": _words("2|3|5|7|10|12|15|20|30|40"),
    "small_en": _words("2|3|4|5|like 4|barely 3"),
    "meal_en": _words("lunch|dinner|breakfast|brunch|a late-night snack|second dinner"),
    "food_en": _words(
        "ramen|pizza|tacos|sushi|pho|burritos|fried chicken|bibimbap|tteokbokki|korean bbq|"
        "pad thai|dumplings|poke|bagels|pancakes|curry|smash burgers|mac and cheese|"
        "carbonara|hot pot|ribs|shawarma|falafel|croissants|cheesecake|boba|dim sum|"
        "naengmyeon|kimchi fried rice|jjajangmyeon|gukbap|chicken wings|birria|udon"
    ),
    "spot_en": _words(
        "the gym|the library|that ramen place|the office|Costco|the mall|the park|"
        "downtown|the climbing gym|the new cafe|Hongdae|Seongsu|the night market|"
        "the farmers market|the arcade|the beach|campus|the coworking space"
    ),
    "spot_study_en": _words("the library|a cafe|home|the study room|campus|Starbucks"),
    "act_plan_en": _words(
        "karaoke|an escape room|board games|a museum trip|bowling|a movie|a hike|"
        "a picnic|a concert|mini golf|a pub quiz|laser tag"
    ),
    "city_en": _words(
        "Tokyo|Seoul|Busan|Jeju|Osaka|Bangkok|Taipei|Lisbon|Denver|Chicago|Vancouver|"
        "Berlin|London|Paris|New York|Kyoto|Da Nang|Singapore|Melbourne|Austin|Gyeongju|Hanoi"
    ),
    "game_en": _words(
        "League|Valorant|PUBG|Minecraft|Elden Ring|Zelda|Stardew Valley|Genshin|Overwatch 2|"
        "FIFA|Baldur's Gate 3|Hades 2|Helldivers 2|Palworld|Apex|Tetris|Balatro|Hollow Knight|"
        "Factorio|Pokemon|Lost Ark|MapleStory|Tekken 8|Monster Hunter"
    ),
    "rank_en": _words("gold|plat|diamond|bronze|silver|emerald|masters|immortal|radiant|champ"),
    "game_op_en": _words(
        "balance is totally broken|the nerfs are brutal|actually pretty good this time|"
        "so many bugs|the new character is busted|love the new map|way too grindy now|"
        "servers are on fire|kinda meh|best patch in years"
    ),
    "work_en": _words(
        "standup|performance review|client call|job interview|demo|all-hands|1:1|"
        "sprint planning|offsite|design review|incident review|quarterly planning"
    ),
    "doc_en": _words("slides|report|roadmap|budget sheet|postmortem|design doc|metrics dashboard|release notes"),
    "company_en": _words(
        "Google|a startup|Stripe|Coupang|Naver|Kakao|a game studio|a fintech|Toss|"
        "an agency|Shopify|Notion|Line|Samsung|a consulting firm"
    ),
    "result_en": _words(
        "I got the offer!!|didn't make it :(|still waiting|moving on to the final round|"
        "they want a second interview|rejected lol|got through the phone screen|"
        "they ghosted me"
    ),
    "tech_act_en": _words("deploy|merge|review|refactor|roll back|hotfix|test|ship|migrate|release"),
    "tech_en": _words(
        "login API|payment service|notification server|db schema|CI pipeline|search feature|"
        "cache layer|frontend build|docker image|auth flow|crawler|dashboard|admin panel|"
        "batch job|websocket server|signup form|recommendation API|logging config|k8s config|mobile app"
    ),
    "bug_en": _words(
        "a null pointer|timeouts|an infinite loading spinner|a memory leak|CORS errors|"
        "flaky tests|a race condition|encoding issues|500s|a deadlock|a timezone bug|"
        "stale cache|double charges|an off-by-one|segfaults"
    ),
    "lang_en": _words("Python|Node|React|Spring|TypeScript|Go|Rust|Django|Next.js|Kotlin|FastAPI|Vue"),
    "pet_en": _words("cat|dog|hamster|parrot|turtle|bunny|hedgehog|goldfish|puppy|kitten"),
    "vet_en": _words(
        "all good|needs more shots|had to get a tooth pulled|a little chunky apparently|"
        "totally healthy|tummy bug, nothing serious|neutering went fine"
    ),
    "pet_act_en": _words(
        "ate my charger cable|knocked everything off the desk|slept all day|"
        "climbed into a shipping box|won't stop meowing for treats|learned to sit|"
        "stole my sock|finally used the scratching post|hid under the bed all morning|"
        "sulked after a bath"
    ),
    "weather_en": _words(
        "pouring|snowing|way too hot|freezing|so humid|super windy|gorgeous|foggy|"
        "finally sunny|gross and gray|hailing|cherry blossom season"
    ),
    "weather_fut_en": _words(
        "it's gonna rain|it's gonna snow|there's a heat wave coming|a typhoon is coming|"
        "it's supposed to get really cold|the yellow dust is back|it's finally warming up"
    ),
    "study_en": _words(
        "TOEIC|algorithms|stats|Japanese|calculus|economics|Spanish|networking|"
        "data structures|operating systems|Korean|linear algebra|machine learning|SQL|"
        "organic chem|physics|AWS|accounting"
    ),
    "score_en": _words("an 850|a 900|a 70|an A|a B+|a perfect score|a pass|a 95|a C|barely a pass"),
    "item_en": _words(
        "mechanical keyboard|monitor|GPU|iPad|AirPods|laptop|office chair|mouse|Switch|"
        "camera|running shoes|puffer jacket|smartwatch|4090|MacBook|air purifier|e-bike|headphones"
    ),
    "show_en": _words(
        "Squid Game|Dune|Interstellar|The Bear|Severance|Arcane|Frieren|One Piece|"
        "Shogun|The Last of Us|Culinary Class Wars|Inside Out 2|Spider-Verse|Jujutsu Kaisen|"
        "Succession|Queen of Tears|Chainsaw Man|Fallout"
    ),
    "book_en": _words(
        "Pachinko|Project Hail Mary|Atomic Habits|Clean Code|Sapiens|The Midnight Library|"
        "Dune|Tomorrow and Tomorrow and Tomorrow|Demian|The Vegetarian|Almond|"
        "Designing Data-Intensive Applications|The Three-Body Problem|Normal People"
    ),
    "book_op_en": _words(
        "it's a slow start but good|can't put it down|kinda dense tbh|halfway through and loving it|"
        "highlighting like crazy|perfect for the commute|the translation is a bit off"
    ),
    "artist_en": _words(
        "IU|NewJeans|Seventeen|aespa|BTS|Le Sserafim|Day6|Taylor Swift|Olivia Rodrigo|"
        "Billie Eilish|Hozier|Mitski|Bad Bunny|Radiohead|Stray Kids|Hyukoh"
    ),
    "opinion_en": _words(
        "so good|overrated|actually amazing|kinda mid|worth the hype|not bad|incredible|"
        "a bit boring|way better than expected|just okay"
    ),
    "exercise_en": _words(
        "leg day|a long run|a spin class|a yoga class|a climbing session|a swim|"
        "a HIIT workout|a hike|pilates|a 10k|tennis|crossfit"
    ),
    "feel_en": _words(
        "so tired|exhausted|pretty happy|bored out of my mind|stressed|hyped|"
        "kinda sad|fried|in a great mood|dead inside lol|super proud|all over the place"
    ),
    "feel_adj_en": _words("tired|sleepy|hungry|bored|stressed|unproductive|hyped|cranky|emotional|restless"),
    "react_en": _words(
        "lol|lmao|haha|omg|nice|rip|fr|ngl|same|wait what|no way|LOL|hahaha|"
        "oof|big if true|let's go|yikes|W|L|based|💀|😂"
    ),
}

# Prefixes / suffixes add realistic noise and multiply the text space.
_PREFIX: dict[str, list[_W]] = {
    "ko": [_W(w + " ") for w in _words("아|헐|근데|야|ㅋㅋㅋ|와|음|혹시|그러고 보니|"
                                       "참|오|아니|ㄹㅇ|솔직히|아무튼|그나저나|앗")],
    "en": [_W(w + " ") for w in _words("ok|oh|btw|wait|so|lol|honestly|hmm|ngl|also|tbh|ah|yo|anyway|fyi")],
}
_SUFFIX: dict[str, list[_W]] = {
    "ko": [_W(" " + w) for w in _words("ㅋㅋ|ㅋㅋㅋㅋ|ㅠㅠ|ㅎㅎ|ㄷㄷ|😂|👍|🥲|🔥|ㅋ|ㅜ|🙏")]
    + [_W(w) for w in ("!!", "..", "~", "?!", "!", "~~")],
    "en": [_W(" " + w) for w in _words("lol|haha|😂|👍|🥲|🔥|💀|lmao|:)|xD|🙏|tbh")]
    + [_W(w) for w in ("!!", "...", "!", "?!", " !!")],
}

# Korean verb-ending slots (attach to the stem written in the template).
_VOCAB.update(
    {
        # after a past stem ending in ㅆ (했/먹었/갔/봤 ...)
        "e_past": _endings("어|어|어|어요|다|음|는데|지롱|거든|습니다|어 ㅋㅋ"),
        # question after a past stem
        "e_q": _endings("어?|어?|어요?|냐?|니?|음?|나요?|지?|어??"),
        # after a ㄹ-future stem (갈/먹을/할 ...)
        "e_will": _endings("래?|래?|래요?|까?|까요?| 사람?| 사람 있어?|래 말래?"),
        # after 거 (갈 거__)
        "e_plan": _endings("야|야|예요|임|다| 같아|에요"),
        # after an 있 adjective stem (맛있/재밌/멋있)
        "e_desc": _endings("어|더라|음|었어|네|어요|더라고요|던데"),
        # after 해야
        "e_must": _endings(" 돼| 됨| 해| 돼요| 한다|겠다|겠어"),
    }
)

# ---------------------------------------------------------------------------
# Message templates, grouped by topic so channels can bias what gets said
# ---------------------------------------------------------------------------

_TEMPLATES: dict[str, dict[str, list[str]]] = {
    "ko": {
        "greeting": [
            "{hi_ko} 다들 뭐 해? 나는 {food_ko} 먹는 중",
            "{hi_ko} {name:야} {time_past_ko} 잘 들어갔{e_q}",
            "좋은 아침~ 오늘도 {feel_ko} {drink_ko} 수혈 중",
            "{name:야} 오랜만이다 요즘 어떻게 지내? 아직 {company_ko} 다녀?",
            "나 왔{e_past} 오늘 {work_ko} 때문에 {spot_ko}에서 늦게 나왔음",
            "다들 주말 잘 보냈{e_q} 나는 {spot_ko} 다녀왔{e_past}",
            "{hi_ko} 오늘 {city_ko:는} {weather_ko}",
            "퇴근했다!! 오늘 {work_ko} 때문에 진짜 {feel_ko}",
        ],
        "food": [
            "{time_past_ko} {food_ko} 먹었{e_past}",
            "{time_fut_ko} {food_ko} 먹을{e_will}",
            "점심 뭐 먹지? {food_ko} 아니면 {food_ko2}",
            "{spot_ko} 근처에 {food_ko} 맛집 아는 사람?",
            "{name:가} 추천해준 {food_ko} 집 진짜 맛있{e_desc}",
            "아 배고파 {food_ko:랑} {drink_ko} 시켜 먹을까",
            "오늘 저녁은 {food_ko:랑} {drink_ko} 조합 ㄱㄱ",
            "나 요즘 {food_ko}에 완전 빠졌{e_past}",
            "{food_ko} {price_ko} 주고 먹었는데 양이 너무 적었{e_past}",
            "{name:는} 다이어트 한다면서 {food_ko} 먹는 중 ㅋㅋ",
            "{name:는} {food_ko} 진짜 좋아하더라",
            "배달 {num_ko}분 걸린대 ㅠㅠ {food_ko} 언제 와",
            "{city_ko}에서 먹은 {food_ko} 아직도 생각나",
        ],
        "game": [
            "{time_fut_ko} {game_ko} 할{e_will}",
            "{game_ko} 랭겜 드디어 {rank_ko} 찍었{e_past}",
            "{name:랑} {game_ko} 하다가 밤샜{e_past}",
            "{game_ko} 신규 패치 봤{e_q} {game_op_ko}",
            "오늘 {game_ko} {num_ko}연패 중이라 멘탈 나감",
            "{game_ko} 세일 중이던데 {price_ko}이면 살까 말까",
            "{name} 디코 들어와 {game_ko} 한 판 ㄱ",
            "{name:는} {game_ko} 진짜 잘하더라 {react_ko}",
            "{game_ko} {dur_ko}째 하는 중인데 안 질려",
        ],
        "work": [
            "{time_fut_ko} {work_ko} 있어서 준비해야{e_must}",
            "{time_past_ko} {work_ko} 진짜 길었{e_past}",
            "{time_past_ko} 본 {company_ko} 면접 {result_ko}",
            "오늘도 {work_ko} 때문에 야근각 ㅠㅠ {food_ko:나} 시켜야지",
            "팀장님이 {work_ko} 자료 {deadline_ko}까지 달래",
            "{company_ko}에서 {time_past_ko} 연락 왔{e_past}",
            "나 {company_ko:로} 이직할까 고민 중 {lang_ko} 쓰는 팀이래",
            "재택이라 {work_ko} 끝나고 바로 누웠{e_past}",
        ],
        "coding": [
            "{time_past_ko} {tech_act_ko} 했{e_q}",
            "{tech_ko}에서 {bug_ko} 나는데 원인을 모르겠어",
            "{tech_ko} {bug_ko} 드디어 잡았{e_past}",
            "{name:야} {tech_ko} PR 올렸으니까 리뷰 좀 부탁해",
            "{lang_ko} 버전 올렸더니 {tech_ko} 다 깨졌{e_past}",
            "{name:가} {tech_ko} 고쳤대",
            "{tech_ko} CI 또 빨간불이야 {bug_ko} 때문인 듯",
            "{name:야} {tech_ko} {tech_act_ko} 전에 테스트 꼭 돌려줘",
            "{lang_ko:로} {tech_ko} 새로 짜볼까 생각 중",
            "로컬에선 되는데 서버에서 {bug_ko} 남 {react_ko}",
            "{time_fut_ko} {tech_ko} {tech_act_ko} 할 거{e_plan}",
            "{bug_ko} 찾느라 {dur_ko} 날렸는데 오타였음",
        ],
        "travel": [
            "{time_fut_ko} {city_ko} 가기로 했{e_past}",
            "{city_ko} 여행 {name:랑} 갈 건데 맛집 추천 좀",
            "{name:는} {time_fut_ko} {city_ko} 간대",
            "KTX 예매했{e_past} {city_ko}까지 {dur_ko} 걸림",
            "{city_ko} {nights_ko:로} 가는데 숙소 어디가 좋아?",
            "{city_ko} 비행기 표 {price_ko}에 잡았{e_past}",
            "{city_ko} 가서 {food_ko} 먹고 바다 보고 싶다...",
            "{time_past_ko} {city_ko} 다녀왔는데 {food_ko} 진짜 맛있{e_desc}",
        ],
        "pets": [
            "우리 {pet_ko} {pet_name:가} 오늘 {pet_act_ko}",
            "{name:는} {pet_ko} 입양했대 이름은 {pet_name:이래}",
            "{name:야} {pet_ko} 사진 올려줘 {react_ko}",
            "{time_past_ko} {pet_name} 병원 다녀왔는데 {vet_ko}",
            "{name:는} {pet_ko} 사료 뭐 먹여?",
            "{pet_name:가} 키보드 위에서 자고 있어서 {work_ko} 준비를 못 함 ㅋㅋ",
            "{pet_ko} 키우고 싶다 진짜 이름은 {pet_name:로} 할 거{e_plan}",
        ],
        "weather": [
            "오늘 {city_ko} {weather_ko}",
            "{time_fut_ko} {city_ko} {weather_fut_ko}",
            "{name:야} 우산 챙겨 {time_fut_ko} {weather_fut_ko}",
            "{city_ko:는} 지금 {weather_ko}",
            "아침부터 {weather_ko} 그래서 {feel_ko} {react_ko}",
        ],
        "study": [
            "{study_ko} 공부하기 싫다 {game_ko:나} 하고 싶어",
            "{time_fut_ko} {study_ko} 시험이야 {react_ko}",
            "{spot_study_ko}에서 {name:랑} {study_ko} 공부 중",
            "{study_ko} 점수 {score_ko} 나왔{e_past}",
            "{name:랑} {study_ko} 스터디 하기로 했{e_past}",
            "{name:야} {study_ko} 강의 추천해줄 수 있어?",
            "{hour_ko}까지 {study_ko} 하고 잘 거{e_plan}",
        ],
        "plans": [
            "{time_fut_ko} {spot_ko} 갈{e_will}",
            "{time_fut_ko} 몇 시에 만나? {spot_ko}에서 {hour_ko} 괜찮아?",
            "{name:랑} {time_fut_ko} {spot_ko}에서 보기로 했{e_past}",
            "{time_fut_ko} 시간 되는 사람 {act_plan_ko} 갈{e_will}",
            "미안 {name:야} {time_fut_ko} {work_ko} 있어서 못 갈 듯",
            "{name} 생일 {date_ko}인데 뭐 선물하지",
        ],
        "shopping": [
            "{item_ko} {price_ko}에 샀{e_past}",
            "{item_ko} {price_ko}인데 살까?",
            "{name:가} 산 {item_ko} 써봤는데 괜찮더라",
            "{spot_ko} 매장에서 {item_ko} 할인하는 거 봤{e_q}",
            "택배 왔다 {item_ko} 개봉기 ㄱㄱ {react_ko}",
            "{item_ko} 고장났{e_past} {react_ko}",
        ],
        "media": [
            "{media_ko} 봤{e_q} 완전 {opinion_ko}",
            "요즘 {book_ko} 읽는 중인데 {book_op_ko}",
            "{music_ko} 신곡 들었{e_q} {opinion_ko}",
            "{music_ko} 콘서트 티켓팅 실패했다 ㅠㅠ 대기 {num_ko}만 번이었음",
            "{name:야} {media_ko} 다음 시즌 언제 나와?",
            "{time_past_ko} {media_ko} 정주행했{e_past}",
        ],
        "health": [
            "{time_past_ko} {exercise_ko} 했더니 온몸이 쑤셔",
            "요즘 {name:랑} {exercise_ko} 다니는 중",
            "{exercise_ko} {num_ko}일째 성공 {react_ko}",
            "감기 걸렸{e_past} ㅠㅠ {time_fut_ko} {work_ko} 어떡하지",
            "{game_ko} 하느라 잠을 {small_ko}시간밖에 못 잤{e_past}",
        ],
        "smalltalk": [
            "{react_ko} {react_ko2}",
            "ㄹㅇ {work_ko} 때문에 {feel_ko}",
            "{name} 말이 맞아 {react_ko}",
            "아 그거 {name:가} 말한 거잖아 {react_ko}",
            "헐 진짜? {name:가} 그랬어? {react_ko}",
            "{name:야} 나도 그렇게 생각해",
            "오늘 왜 이렇게 {feel_ko} {drink_ko} 마셔야겠다",
            "와 {name} 말대로 {media_ko} 좀 {opinion_ko}",
        ],
    },
    "en": {
        "greeting": [
            "{hi_en} everyone, how's it going? just got back from {spot_en}",
            "{hi_en} all ☀️ it's {weather_en} in {city_en} today",
            "{hi_en} {name}! long time no see",
            "back from {spot_en} with {name}, what did I miss?",
            "finally off work after the {work_en}, {feel_en}",
            "gm {name}, you up? {game_en}?",
            "good night guys, {time_fut_en} is gonna be a long day with the {work_en}",
        ],
        "food": [
            "just had {food_en} for {meal_en} at {spot_en}",
            "anyone want to get {food_en} {time_fut_en}?",
            "{food_en} or {food_en2} for dinner?",
            "the {food_en} place near {spot_en} is {opinion_en}",
            "{name} recommended this {food_en} spot and it was {opinion_en}",
            "i'm so hungry, thinking about ordering {food_en} from that place near {spot_en}",
            "{name} keeps talking about {food_en} lol",
            "paid {price_en} for {food_en} and the portion was tiny",
            "trying to make {food_en} for {name} tonight, wish me luck",
            "ok {food_en} {time_past_en} was a mistake",
            "my comfort food is still {food_en} and {food_en2} ngl",
        ],
        "game": [
            "anyone down for {game_en} {time_fut_en}?",
            "finally hit {rank_en} in {game_en} after {num_en} games",
            "stayed up till {hour_en} playing {game_en} with {name}",
            "did you see the new {game_en} patch? {game_op_en}",
            "lost {num_en} games in a row in {game_en}, i'm done {react_en}",
            "{game_en} is on sale for {price_en}, should i get it",
            "{name} hop in voice, {game_en} one more round",
            "{name} is cracked at {game_en} ngl",
            "been playing {game_en} for {dur_en} straight and still not bored",
        ],
        "work": [
            "got a {work_en} with {company_en} {time_fut_en}, wish me luck",
            "the {work_en} {time_past_en} went way too long, {feel_en}",
            "heard back from {company_en} about the {lang_en} role: {result_en}",
            "my manager wants the {doc_en} for the {work_en} by {deadline_en}",
            "thinking about switching to {company_en} for a {lang_en} role",
            "working late again because of the {work_en} {react_en}",
            "wfh today, {feel_en}, eating {food_en} at my desk",
            "{company_en} reached out {time_past_en} about a {lang_en} role",
        ],
        "coding": [
            "{name} did you {tech_act_en} the {tech_en} yet?",
            "the {tech_en} is throwing {bug_en} again",
            "finally fixed {bug_en} in the {tech_en} after {dur_en}",
            "pushed a PR for the {tech_en}, can someone review?",
            "upgraded {lang_en} and now the {tech_en} is broken {react_en}",
            "{name} fixed the {tech_en}, huge",
            "CI is red again on the {tech_en}, probably {bug_en}",
            "works on my machine but the {tech_en} in prod has {bug_en} lol",
            "thinking of rewriting the {tech_en} in {lang_en}",
            "please run the tests before you {tech_act_en} the {tech_en}",
            "spent {dur_en} debugging {bug_en} in the {tech_en} and it was a typo",
            "gonna {tech_act_en} the {tech_en} {time_fut_en}",
        ],
        "travel": [
            "booked flights to {city_en} for {date_en}!",
            "{name} is going to {city_en} {time_fut_en}",
            "any tips for {city_en}? going with {name} for {trip_en}",
            "still thinking about the {food_en} we had in {city_en}",
            "the train to {city_en} takes like {dur_en}",
            "best area to stay in {city_en} for {trip_en}?",
            "got a cheap ticket to {city_en}, only {price_en}",
            "miss {city_en} and the {food_en} so much",
        ],
        "pets": [
            "my {pet_en} {pet_name} {pet_act_en} today",
            "{name} adopted a {pet_en} and named it {pet_name}",
            "pics of {pet_name} the {pet_en} or it didn't happen",
            "took {pet_name} to the vet {time_past_en}, {vet_en}",
            "{name} what food do you give your {pet_en}?",
            "{pet_name} is sleeping on my keyboard again during the {work_en} lol",
            "I really want a {pet_en}, gonna name it {pet_name}",
        ],
        "weather": [
            "it's {weather_en} here in {city_en}",
            "apparently {weather_fut_en} {time_fut_en}",
            "{name} don't forget an umbrella, {weather_fut_en} {time_fut_en}",
            "{city_en} is {weather_en} right now, {feel_en}",
            "this weather has me {feel_en} {react_en}",
        ],
        "study": [
            "studying {study_en} at {spot_study_en} until {hour_en}",
            "{study_en} exam {time_fut_en}, send help",
            "got {score_en} on the {study_en} test",
            "{name} and I started a study group for {study_en}",
            "{name} any good courses for {study_en}?",
            "gonna grind {study_en} until {hour_en} then get {food_en}",
            "I don't want to study {study_en} anymore {react_en}",
        ],
        "plans": [
            "{name} wanna go to {spot_en} {time_fut_en}?",
            "what time are we meeting at {spot_en} {time_fut_en}? {hour_en} works for me",
            "{name} and I are meeting at {spot_en} {time_fut_en}",
            "anyone free {time_fut_en}? thinking {act_plan_en} near {spot_en}",
            "sorry {name}, can't make it {time_fut_en}, got a {work_en}",
            "{name}'s birthday is {date_en}, what should we get them?",
        ],
        "shopping": [
            "just bought a new {item_en} for {price_en}",
            "the {item_en} I want is {price_en}, worth it?",
            "tried {name}'s {item_en}, it's {opinion_en}",
            "did you see the {item_en} sale? {price_en} off",
            "unboxing my new {item_en} rn, {opinion_en} so far",
            "my {item_en} just broke {react_en}",
        ],
        "media": [
            "{name} did you watch {show_en}? it's {opinion_en}",
            "currently reading {book_en} because {name} recommended it, {book_op_en}",
            "{artist_en} dropped a new album {time_past_en}, it's {opinion_en}",
            "couldn't get {artist_en} tickets, sold out in {num_en} minutes",
            "{name} when does the next season of {show_en} come out?",
            "binged {show_en} {time_past_en} with {food_en}",
        ],
        "health": [
            "did {exercise_en} {time_past_en} and everything hurts",
            "day {num_en} of going to the gym {react_en}",
            "caught a cold {time_past_en} and now I'm {feel_en}, stay safe guys",
            "only got {small_en} hours of sleep, the {work_en} {time_fut_en} is gonna hurt",
            "trying to get into {exercise_en} with {name}, any tips?",
        ],
        "smalltalk": [
            "{react_en} {react_en2}",
            "{name} is right about {game_en} tho",
            "wait that's what {name} said {time_past_en}",
            "no way {name} actually did that {react_en}",
            "same as {name} tbh, {feel_en}",
            "why am I so {feel_adj_en} today, blame {name} and the {work_en}",
            "{name} honestly {show_en} was {opinion_en}",
            "{name} 화이팅!! you got the {work_en} {time_fut_en}",
        ],
    },
}

_TOPICS: tuple[str, ...] = tuple(_TEMPLATES["ko"])

# ---------------------------------------------------------------------------
# Query templates: same topics, different surface forms (questions *about*
# chat history), so they never coincide with a corpus sentence.
# ---------------------------------------------------------------------------

_QUERY_TEMPLATES: dict[str, list[str]] = {
    "ko": [
        "{name:가} 주말에 어디 간다고 했지?",
        "{name:가} 키우는 {pet_ko} 이름이 뭐였더라?",
        "{name:가} 좋아하는 음식이 뭐라고 했었지?",
        "{name:가} {game_ko} 얘기하면서 뭐라고 했었지?",
        "{spot_ko}에서 누구 만나기로 했었지?",
        "{name} 면접 결과 어떻게 됐다고 했지?",
        "{name:가} 요즘 읽는 책 제목이 뭐였지?",
        "{name} 생일이 언제라고 했었지?",
        "{tech_ko} 관련해서 {name:가} 뭐라고 했었어?",
        "지난번에 {food_ko} 맛집 추천해준 사람 누구였지?",
        "{city_ko} 여행 간다던 사람 누구였더라?",
        "{name:가} 새로 산 {item_ko} 어떻다고 했었지?",
        "{name:가} {tech_act_ko} 언제 한다고 했었지?",
        "{bug_ko} 누가 고쳤다고 했었지?",
        "{name:가} 준비하던 {study_ko} 시험 어떻게 됐대?",
        "{name:가} 다닌다던 운동이 뭐였더라?",
        "{media_ko} 재밌다고 한 사람 누구였지?",
        "{name} 요즘 어느 회사 면접 본다고 했었지?",
        "우리 {act_plan_ko} 가기로 한 날짜가 언제였지?",
        "{name:가} 좋아한다던 가수가 누구였더라?",
        "{name} 고양이 이름 기억나?",
        "{city_ko}에서 뭐 먹었다고 했었는지 알려줘",
        "{name:는} 요즘 무슨 게임에 빠져 있다고 했었지?",
        "{name:랑} 마지막으로 무슨 얘기 했었는지 요약해줘",
        "{name:가} {deadline_ko}까지 해야 한다던 게 뭐였지?",
        "{name:가} {lang_ko:로} 뭘 새로 만든다고 했었어?",
    ],
    "en": [
        "what did {name} say about the new {item_en}?",
        "where was {name} going {time_fut_en}?",
        "who mentioned {food_en} last week?",
        "did {name} ever sort out the {tech_en} bug?",
        "what's the name of {name}'s {pet_en}?",
        "when is {name}'s birthday again?",
        "which book was {name} reading?",
        "how did {name}'s job interview go?",
        "remind me what {name} thought of {show_en}",
        "who was planning a trip to {city_en}?",
        "what rank did {name} reach in {game_en}?",
        "what was the bug in the {tech_en} about?",
        "who recommended the {food_en} place?",
        "what time did we agree to meet for {act_plan_en}?",
        "which company did {name} hear back from?",
        "what does {name} usually eat for {meal_en}?",
        "did anyone say when the {tech_en} would ship?",
        "what was {name} studying for?",
        "summarize what {name} said about {game_en}",
        "who adopted a {pet_en} recently?",
        "what's {name}'s favorite food?",
        "which {artist_en} concert was {name} trying to get tickets for?",
        "what language did {name} want to rewrite the {tech_en} in?",
        "{name} 고양이 name was what again?",
        "what did {name} 말했어 about {city_en}?",
        "remind me who was going to {spot_en} {time_fut_en}",
    ],
}


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------

# 2026-01-01T00:00:00+09:00 — an arbitrary fixed epoch so timestamps are reproducible.
_START_TS = 1767193200.0
_MEAN_GAP_S = 45.0  # average seconds between messages across all guilds


def _flatten_channels() -> tuple[list[tuple[str, str, tuple[str, ...]]], list[int]]:
    rows: list[tuple[str, str, tuple[str, ...]]] = []
    weights: list[int] = []
    for guild, channels in _GUILDS.items():
        for channel, weight, topics in channels:
            rows.append((guild, channel, topics))
            weights.append(weight)
    return rows, weights


_CHANNELS, _CHANNEL_WEIGHTS = _flatten_channels()
_CHANNEL_CUM: list[int] = []
_acc = 0
for _w in _CHANNEL_WEIGHTS:
    _acc += _w
    _CHANNEL_CUM.append(_acc)
del _acc, _w

_MEMBERS_BY_LANG: dict[str, dict[str, list[str]]] = {
    g: {
        "ko": [m for m in ms if _SPEAKER_LANG[m] == "ko"],
        "en": [m for m in ms if _SPEAKER_LANG[m] == "en"],
    }
    for g, ms in _MEMBERS.items()
}


def _fill(rng: random.Random, template: str, speaker: str = "") -> str:
    return template.format_map(_Slots(rng, _VOCAB, speaker))


_CLAUSE_END = frozenset("?!.~)")
_JOINERS = {"ko": (" ", " ", ". ", ", "), "en": (". ", ", ", " - ", ". ")}


def _compose(rng: random.Random, lang: str, topics: tuple[str, ...], speaker: str) -> str:
    """Build one message: 1-3 template clauses plus optional mention/prefix/suffix.

    Multi-clause messages and the noise words are what stretch the length
    distribution (2 to ~40 words) and keep texts distinct at 100k.
    """
    by_topic = _TEMPLATES[lang]
    r = rng.random()
    n_parts = 1 if r < 0.80 else (2 if r < 0.96 else 3)
    text = ""
    for i in range(n_parts):
        # Stay on the channel's topic most of the time, drift occasionally.
        topic = rng.choice(topics) if rng.random() < 0.65 else rng.choice(_TOPICS)
        part = _fill(rng, rng.choice(by_topic[topic]), speaker)
        if i == 0:
            text = part
        elif text[-1] in _CLAUSE_END or not text[-1].isalnum():
            text = text + " " + part
        else:
            text = text + rng.choice(_JOINERS[lang]) + part
    if rng.random() < 0.40:
        text = rng.choice(_PREFIX[lang]) + text
    if rng.random() < 0.08:  # Discord-style mention
        mention = rng.choice(_VOCAB["name"])
        if mention != speaker:
            text = "@" + mention + " " + text
    if rng.random() < 0.45:
        text = text + rng.choice(_SUFFIX[lang])
    return text


def generate_messages(n: int, seed: int = 7) -> list[ChatMessage]:
    """Generate ``n`` synthetic chat messages, deterministically from ``seed``.

    Roughly half the messages are Korean and half English; each speaker has a
    home language but sometimes writes in the other one, as in real bilingual
    servers.  Timestamps start at 2026-01-01 KST and increase by exponential
    gaps (mean 45 s), so the corpus looks like a busy multi-channel server and
    time-windowed queries have realistic density.

    Args:
        n: number of messages (0 allowed).
        seed: RNG seed; the same ``(n, seed)`` always yields the same list and
            a prefix of a larger run with the same seed is *not* guaranteed
            (callers should generate the size they need).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out: list[ChatMessage] = []
    append = out.append
    ts = _START_TS
    channels = _CHANNELS
    cum = _CHANNEL_CUM
    total = cum[-1]
    members_by_lang = _MEMBERS_BY_LANG
    for _ in range(n):
        guild, channel, topics = channels[bisect_right(cum, rng.random() * total)]
        lang = "ko" if rng.random() < 0.5 else "en"
        # 85%: someone whose home language matches; else a bilingual switch.
        pool = members_by_lang[guild][lang if rng.random() < 0.85 else ("en" if lang == "ko" else "ko")]
        speaker = rng.choice(pool)
        text = _compose(rng, lang, topics, speaker)
        ts += rng.expovariate(1.0 / _MEAN_GAP_S)
        append(ChatMessage(text, speaker, channel, guild, lang, round(ts, 3)))
    return out


def generate_queries(n: int, seed: int = 1007) -> list[str]:
    """Generate ``n`` memory-lookup questions a user might ask, deterministically.

    Half Korean, half English (with a few code-mixed ones).  They reuse the
    corpus's people and topics so retrieval has relevant candidates, but come
    from separate question templates so no query is ever a verbatim corpus
    message — benchmarks then measure search, not exact-match shortcuts.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(n):
        lang = "ko" if (i % 2 == 0) ^ (rng.random() < 0.1) else "en"
        out.append(_fill(rng, rng.choice(_QUERY_TEMPLATES[lang])))
    return out
