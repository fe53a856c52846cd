"""Public library: authors, books, members and loans."""

from __future__ import annotations

import random
from datetime import date, timedelta

from skyrl_tool_agent.data.builtin.names import (
    CITIES, email_for, iso_date, maybe, person_names, skewed_choices, titles,
)
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

GENRES = ("Fantasy", "Sci-Fi", "Mystery", "Romance", "History", "Poetry", "Biography", "Thriller")
PRICES = (7.99, 9.99, 12.5, 14.99, 18.0, 19.99, 24.5, 29.95)
MEMBERSHIPS = ("Standard", "Premium", "Student")

TABLES = (
    Table("authors", (
        ("author_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("country", "TEXT"),
        ("birth_year", "INTEGER"),
    )),
    Table("books", (
        ("book_id", "INTEGER PRIMARY KEY"), ("title", "TEXT NOT NULL"), ("author_id", "INTEGER NOT NULL"),
        ("genre", "TEXT"), ("published_year", "INTEGER"), ("pages", "INTEGER"), ("price", "REAL"),
    ), (("author_id", "authors", "author_id"),)),
    Table("members", (
        ("member_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("city", "TEXT"),
        ("email", "TEXT"), ("join_date", "TEXT"), ("membership_type", "TEXT"),
    )),
    Table("loans", (
        ("loan_id", "INTEGER PRIMARY KEY"), ("book_id", "INTEGER NOT NULL"), ("member_id", "INTEGER NOT NULL"),
        ("loan_date", "TEXT NOT NULL"), ("return_date", "TEXT"),
    ), (("book_id", "books", "book_id"), ("member_id", "members", "member_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    authors = [
        (i, name, rng.choice(CITIES)[1], maybe(rng, rng.randint(1935, 1992), 0.15))
        for i, name in enumerate(person_names(rng, 40), 1)
    ]
    author_ids = skewed_choices(rng, range(1, 41), 120)
    books = [
        (i, title, author_ids[i - 1], rng.choice(GENRES), rng.randint(1968, 2023),
         rng.randint(96, 880), rng.choice(PRICES))
        for i, title in enumerate(titles(rng, 120), 1)
    ]
    members = [
        (i, name, rng.choice(CITIES[:8])[0], maybe(rng, email_for(name, "readmail.org"), 0.2),
         iso_date(rng, "2016-01-01", "2023-12-31"), rng.choice(MEMBERSHIPS))
        for i, name in enumerate(person_names(rng, 60), 1)
    ]
    book_ids = skewed_choices(rng, range(1, 121), 200)
    member_ids = skewed_choices(rng, range(1, 61), 200)
    loans = []
    for i in range(1, 201):
        loan_date = iso_date(rng, "2022-01-01", "2024-06-30")
        returned = (date.fromisoformat(loan_date) + timedelta(days=rng.randint(3, 42))).isoformat()
        loans.append((i, book_ids[i - 1], member_ids[i - 1], loan_date, maybe(rng, returned, 0.2)))
    return {"authors": authors, "books": books, "members": members, "loans": loans}


BOOK_AUTHOR = "FROM books AS T1 JOIN authors AS T2 ON T1.author_id = T2.author_id"
MEMBER_LOAN = "FROM members AS T1 JOIN loans AS T2 ON T1.member_id = T2.member_id"
MEMBER_LOAN_BOOK = MEMBER_LOAN + " JOIN books AS T3 ON T2.book_id = T3.book_id"
GENRE = "SELECT DISTINCT genre FROM books"
GENRE_PAIRS = (
    "SELECT A.genre AS genre1, B.genre AS genre2 FROM (SELECT DISTINCT genre FROM books) AS A "
    "JOIN (SELECT DISTINCT genre FROM books) AS B ON A.genre < B.genre"
)

TEMPLATES = (
    # single table
    T("count_genre", "SELECT COUNT(*) FROM books WHERE genre = '{genre}'",
      "How many books are in the '{genre}' genre?",
      "Count the books whose genre is '{genre}'.",
      "What is the number of '{genre}' books?", slots=GENRE),
    T("titles_year", "SELECT title FROM books WHERE published_year = {year}",
      "List the titles of books published in {year}.",
      "Which books came out in {year}? Give their titles.",
      "What are the titles of the books whose published year is {year}?",
      slots="SELECT DISTINCT published_year AS year FROM books"),
    T("titles_pages_gt", "SELECT title FROM books WHERE pages > {pages}",
      "Which books have more than {pages} pages?",
      "List the titles of books longer than {pages} pages.",
      slots="SELECT pages FROM books WHERE pages > 640"),
    T("members_city", "SELECT name FROM members WHERE city = '{city}'",
      "List the names of members who live in '{city}'.",
      "Which members are from the city '{city}'?",
      "Give the names of all library members in '{city}'.", slots="SELECT DISTINCT city FROM members"),
    T("avg_price_genre", "SELECT AVG(price) FROM books WHERE genre = '{genre}'",
      "What is the average price of '{genre}' books?",
      "Find the mean price of books in the '{genre}' genre.", slots=GENRE),
    T("authors_country", "SELECT name FROM authors WHERE country = '{country}'",
      "Which authors are from '{country}'?",
      "List the names of authors whose country is '{country}'.",
      slots="SELECT DISTINCT country FROM authors"),
    T("unreturned_count", "SELECT COUNT(*) FROM loans WHERE return_date IS NULL",
      "How many loans have not been returned yet?",
      "Count the loans that have no return date.",
      "What is the number of loans that are still out?"),
    T("members_joined_after", "SELECT name FROM members WHERE join_date > '{date}'",
      "Which members joined after '{date}'?",
      "List the names of members whose join date is later than '{date}'.",
      slots="SELECT join_date AS date FROM members WHERE join_date > '2020-06-30'"),
    T("max_pages", "SELECT MAX(pages) FROM books",
      "What is the largest number of pages of any book?",
      "How many pages does the longest book have?"),
    T("membership_of", "SELECT membership_type FROM members WHERE name = '{name}'",
      "What membership type does '{name}' have?",
      "Find the membership type of the member named '{name}'.", slots="SELECT name FROM members"),
    T("distinct_genres", "SELECT COUNT(DISTINCT genre) FROM books",
      "How many different genres do the books cover?",
      "Count the distinct book genres."),
    T("authors_no_birth", "SELECT name FROM authors WHERE birth_year IS NULL",
      "Which authors have no recorded birth year?",
      "List the authors whose birth year is unknown."),
    T("genre_before_year", "SELECT title FROM books WHERE genre = '{genre}' AND published_year < {year}",
      "List the '{genre}' books published before {year}.",
      "Which books in the '{genre}' genre were published earlier than {year}?",
      slots="SELECT DISTINCT genre, published_year AS year FROM books WHERE published_year > 1985"),
    T("price_of_title", "SELECT price FROM books WHERE title = '{title}'",
      "How much does '{title}' cost?", "What is the price of the book '{title}'?",
      slots="SELECT title FROM books"),
    # one join, GROUP BY or ORDER BY
    T("titles_by_author", f"SELECT T1.title {BOOK_AUTHOR} WHERE T2.name = '{{author}}'",
      "List the titles of books written by '{author}'.",
      "Which books did '{author}' write?",
      "What are the titles of the books by the author '{author}'?",
      slots=f"SELECT DISTINCT T2.name AS author {BOOK_AUTHOR}"),
    T("count_per_genre", "SELECT genre, COUNT(*) FROM books GROUP BY genre",
      "How many books are there in each genre?",
      "For every genre, count the books.",
      "Show each genre with its number of books."),
    T("longest_in_genre", "SELECT title FROM books WHERE genre = '{genre}' ORDER BY pages DESC LIMIT 1",
      "What is the title of the longest '{genre}' book?",
      "Which '{genre}' book has the most pages?", slots=GENRE),
    T("three_longest", "SELECT title FROM books ORDER BY pages DESC LIMIT 3",
      "Name the three longest books.", "What are the titles of the 3 books with the most pages?"),
    T("loans_of_member", f"SELECT COUNT(*) {MEMBER_LOAN} WHERE T1.name = '{{name}}'",
      "How many loans has '{name}' made?",
      "Count the loans of the member named '{name}'.",
      slots=f"SELECT DISTINCT T1.name AS name {MEMBER_LOAN}"),
    T("books_by_country", f"SELECT T1.title {BOOK_AUTHOR} WHERE T2.country = '{{country}}'",
      "List the titles of books by authors from '{country}'.",
      "Which books were written by authors whose country is '{country}'?",
      slots=f"SELECT DISTINCT T2.country AS country {BOOK_AUTHOR}"),
    T("avg_pages_per_genre", "SELECT genre, AVG(pages) FROM books GROUP BY genre",
      "What is the average page count for each genre?",
      "For each genre, show the average number of pages."),
    T("members_type_by_join", "SELECT name FROM members WHERE membership_type = '{mtype}' ORDER BY join_date",
      "List the '{mtype}' members ordered by join date.",
      "Show the names of members with a '{mtype}' membership, earliest join date first.",
      slots="SELECT DISTINCT membership_type AS mtype FROM members"),
    T("loan_dates_of_title",
      "SELECT T2.loan_date FROM books AS T1 JOIN loans AS T2 ON T1.book_id = T2.book_id WHERE T1.title = '{title}'",
      "On which dates was '{title}' borrowed?",
      "List the loan dates of the book '{title}'.",
      slots="SELECT DISTINCT T1.title AS title FROM books AS T1 JOIN loans AS T2 ON T1.book_id = T2.book_id"),
    # nesting, set operations, HAVING, several joins
    T("never_borrowed", "SELECT title FROM books WHERE book_id NOT IN (SELECT book_id FROM loans)",
      "Which books have never been borrowed?",
      "List the titles of books that have no loans."),
    T("pricier_than_genre_avg",
      "SELECT title FROM books WHERE genre = '{genre}' AND price > (SELECT AVG(price) FROM books WHERE genre = "
      "'{genre}')",
      "Which '{genre}' books cost more than the average '{genre}' book?",
      "List the books in the '{genre}' genre whose price is above the '{genre}' average.", slots=GENRE),
    T("genres_having", "SELECT genre FROM books GROUP BY genre HAVING COUNT(*) > {n}",
      "Which genres have more than {n} books?",
      "List the genres with over {n} books.",
      slots="SELECT DISTINCT COUNT(*) - 1 AS n FROM books GROUP BY genre"),
    T("top_author", f"SELECT T2.name {BOOK_AUTHOR} GROUP BY T1.author_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which author has written the most books?",
      "Who is the author with the largest number of books?"),
    T("member_most_loans", f"SELECT T1.name {MEMBER_LOAN} GROUP BY T1.member_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which member has borrowed the most books?",
      "Who is the member with the most loans?"),
    T("readers_of_author",
      f"SELECT DISTINCT T1.name {MEMBER_LOAN_BOOK} JOIN authors AS T4 ON T3.author_id = T4.author_id "
      "WHERE T4.name = '{author}'",
      "Which members have borrowed a book by '{author}'?",
      "List the distinct names of members who borrowed books written by '{author}'.",
      slots=f"SELECT DISTINCT T2.name AS author {BOOK_AUTHOR} JOIN loans AS T3 ON T1.book_id = T3.book_id"),
    T("both_genres",
      f"SELECT T1.name {MEMBER_LOAN_BOOK} WHERE T3.genre = '{{genre1}}' INTERSECT "
      f"SELECT T1.name {MEMBER_LOAN_BOOK} WHERE T3.genre = '{{genre2}}'",
      "Which members have borrowed both '{genre1}' and '{genre2}' books?",
      "Find the names of members who borrowed books in the genre '{genre1}' and also in the genre '{genre2}'.",
      slots=GENRE_PAIRS),
    T("members_never_borrowed", "SELECT name FROM members WHERE member_id NOT IN (SELECT member_id FROM loans)",
      "Which members have never borrowed a book?",
      "List the names of members without any loans."),
    T("authors_without_genre",
      f"SELECT name FROM authors EXCEPT SELECT T2.name {BOOK_AUTHOR} WHERE T1.genre = '{{genre}}'",
      "Which authors have not written any '{genre}' book?",
      "List the authors who have no book in the '{genre}' genre.", slots=GENRE),
)

DOMAIN = Domain("library", TABLES, populate, TEMPLATES)
