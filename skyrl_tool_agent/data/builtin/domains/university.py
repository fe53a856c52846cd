"""University: departments, professors, courses, students and enrollments."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import email_for, iso_date, maybe, person_names, skewed_choices
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

DEPARTMENTS = (
    "Mathematics", "Physics", "Chemistry", "Biology", "Computer Science", "History", "Philosophy",
    "Economics", "Linguistics", "Music", "Art History", "Psychology", "Sociology", "Geology",
    "Statistics", "Mechanical Engineering", "Civil Engineering", "Nursing", "Law", "Political Science",
)
BUILDINGS = ("Main Hall", "Science Center", "Turing Building", "West Wing", "Harbor House", "Library Annex")
COURSE_LEVELS = ("Introduction to", "Advanced", "Topics in", "Seminar in")
SEMESTERS = ("Fall 2022", "Spring 2023", "Fall 2023", "Spring 2024")
GRADES = ("A", "A", "B", "B", "B", "C", "C", "D", "F")

TABLES = (
    Table("departments", (
        ("department_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("building", "TEXT"),
        ("budget", "INTEGER"),
    )),
    Table("professors", (
        ("professor_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("department_id", "INTEGER"),
        ("hire_date", "TEXT"), ("salary", "INTEGER"), ("email", "TEXT"),
    ), (("department_id", "departments", "department_id"),)),
    Table("courses", (
        ("course_id", "INTEGER PRIMARY KEY"), ("title", "TEXT NOT NULL"), ("department_id", "INTEGER"),
        ("credits", "INTEGER"), ("professor_id", "INTEGER"),
    ), (("department_id", "departments", "department_id"), ("professor_id", "professors", "professor_id"))),
    Table("students", (
        ("student_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("department_id", "INTEGER"),
        ("enrollment_year", "INTEGER"), ("gpa", "REAL"),
    ), (("department_id", "departments", "department_id"),)),
    Table("enrollments", (
        ("enrollment_id", "INTEGER PRIMARY KEY"), ("student_id", "INTEGER NOT NULL"),
        ("course_id", "INTEGER NOT NULL"), ("semester", "TEXT"), ("grade", "TEXT"),
    ), (("student_id", "students", "student_id"), ("course_id", "courses", "course_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    budgets = rng.sample(range(200, 2000, 5), 20)
    departments = [(i, name, rng.choice(BUILDINGS), budgets[i - 1] * 1000)
                   for i, name in enumerate(DEPARTMENTS, 1)]
    professors = [
        (i, name, rng.randint(1, 20), iso_date(rng, "1995-01-01", "2023-08-31"),
         rng.randrange(62000, 160000, 500), maybe(rng, email_for(name, "uni.edu"), 0.15))
        for i, name in enumerate(person_names(rng, 45), 1)
    ]
    pool = [(level, d) for level in COURSE_LEVELS for d in range(1, 21)]
    courses = []
    for i, (level, dept) in enumerate(rng.sample(pool, 60), 1):
        teachers = [p[0] for p in professors if p[2] == dept]
        teacher = rng.choice(teachers) if teachers and rng.random() > 0.15 else None
        courses.append((i, f"{level} {DEPARTMENTS[dept - 1]}", dept, rng.choice((2, 3, 3, 4, 5)), teacher))
    students = [
        (i, name, rng.randint(1, 20), rng.randint(2019, 2024), maybe(rng, round(rng.uniform(1.8, 4.0), 2), 0.1))
        for i, name in enumerate(person_names(rng, 150), 1)
    ]
    student_ids = skewed_choices(rng, range(1, 151), 200)
    course_ids = skewed_choices(rng, range(1, 61), 200)
    enrollments = []
    for i in range(1, 201):
        semester = rng.choice(SEMESTERS)
        grade = None if semester == "Spring 2024" and rng.random() < 0.7 else rng.choice(GRADES)
        enrollments.append((i, student_ids[i - 1], course_ids[i - 1], semester, grade))
    return {"departments": departments, "professors": professors, "courses": courses,
            "students": students, "enrollments": enrollments}


COURSE_DEPT = "FROM courses AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id"
PROF_DEPT = "FROM professors AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id"
STUDENT_DEPT = "FROM students AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id"
STUDENT_ENROLL = "FROM students AS T1 JOIN enrollments AS T2 ON T1.student_id = T2.student_id"
STUDENT_COURSE = STUDENT_ENROLL + " JOIN courses AS T3 ON T2.course_id = T3.course_id"
STUDENT_COURSE_DEPT = STUDENT_COURSE + " JOIN departments AS T4 ON T3.department_id = T4.department_id"
YEAR = "SELECT DISTINCT enrollment_year AS year FROM students"

TEMPLATES = (
    # single table
    T("students_year", "SELECT name FROM students WHERE enrollment_year = {year}",
      "Which students enrolled in {year}?",
      "List the names of students whose enrollment year is {year}.", slots=YEAR),
    T("count_credits", "SELECT COUNT(*) FROM courses WHERE credits = {credits}",
      "How many courses are worth {credits} credits?",
      "Count the courses with {credits} credits.", slots="SELECT DISTINCT credits FROM courses"),
    T("depts_in_building", "SELECT name FROM departments WHERE building = '{building}'",
      "Which departments are located in '{building}'?",
      "List the departments housed in the building '{building}'.",
      slots="SELECT DISTINCT building FROM departments"),
    T("budget_of", "SELECT budget FROM departments WHERE name = '{dept}'",
      "What is the budget of the '{dept}' department?",
      "How large is the budget of '{dept}'?", slots="SELECT name AS dept FROM departments"),
    T("avg_gpa_year", "SELECT AVG(gpa) FROM students WHERE enrollment_year = {year}",
      "What is the average GPA of students who enrolled in {year}?",
      "Find the mean gpa of the students with enrollment year {year}.", slots=YEAR),
    T("profs_hired_after", "SELECT name FROM professors WHERE hire_date > '{date}'",
      "Which professors were hired after '{date}'?",
      "List the professors whose hire date is later than '{date}'.",
      slots="SELECT hire_date AS date FROM professors WHERE hire_date > '2012-01-01'"),
    T("students_gpa_gt", "SELECT name FROM students WHERE gpa > {gpa}",
      "Which students have a GPA above {gpa}?",
      "List the names of students with gpa greater than {gpa}.",
      slots="SELECT gpa FROM students WHERE gpa > 3.5"),
    T("no_gpa_count", "SELECT COUNT(*) FROM students WHERE gpa IS NULL",
      "How many students have no GPA recorded?",
      "Count the students whose gpa is missing."),
    T("ungraded_count", "SELECT COUNT(*) FROM enrollments WHERE grade IS NULL",
      "How many enrollments have not been graded yet?",
      "Count the enrollments without a grade."),
    T("max_salary", "SELECT MAX(salary) FROM professors",
      "What is the highest professor salary?",
      "How much does the best-paid professor earn?"),
    T("credits_of_course", "SELECT credits FROM courses WHERE title = '{title}'",
      "How many credits is '{title}' worth?",
      "What is the number of credits of the course '{title}'?", slots="SELECT title FROM courses"),
    T("unassigned_courses", "SELECT title FROM courses WHERE professor_id IS NULL",
      "Which courses have no professor assigned?",
      "List the titles of courses without a professor."),
    T("count_semester", "SELECT COUNT(*) FROM enrollments WHERE semester = '{semester}'",
      "How many enrollments are there in '{semester}'?",
      "Count the enrollments for the semester '{semester}'.",
      slots="SELECT DISTINCT semester FROM enrollments"),
    T("salary_between", "SELECT name FROM professors WHERE salary BETWEEN {low} AND {high}",
      "Which professors earn between {low} and {high}?",
      "List the professors whose salary is between {low} and {high}.",
      slots="SELECT A.salary AS low, B.salary AS high FROM professors AS A JOIN professors AS B "
            "ON B.salary - A.salary BETWEEN 8000 AND 20000"),
    # one join, GROUP BY or ORDER BY
    T("courses_of_dept", f"SELECT T1.title {COURSE_DEPT} WHERE T2.name = '{{dept}}'",
      "Which courses does the '{dept}' department offer?",
      "List the titles of courses in the '{dept}' department.",
      slots=f"SELECT DISTINCT T2.name AS dept {COURSE_DEPT}"),
    T("profs_of_dept", f"SELECT T1.name {PROF_DEPT} WHERE T2.name = '{{dept}}'",
      "Who are the professors of the '{dept}' department?",
      "List the professors working in '{dept}'.", slots=f"SELECT DISTINCT T2.name AS dept {PROF_DEPT}"),
    T("students_per_year", "SELECT enrollment_year, COUNT(*) FROM students GROUP BY enrollment_year",
      "How many students enrolled in each year?",
      "Count the students for every enrollment year."),
    T("best_student_year", "SELECT name FROM students WHERE enrollment_year = {year} ORDER BY gpa DESC LIMIT 1",
      "Which student who enrolled in {year} has the highest GPA?",
      "Who has the best gpa among students with enrollment year {year}?", slots=YEAR),
    T("best_paid_in_dept", f"SELECT T1.name {PROF_DEPT} WHERE T2.name = '{{dept}}' ORDER BY T1.salary DESC LIMIT 1",
      "Who is the best-paid professor in the '{dept}' department?",
      "Which professor of '{dept}' has the highest salary?",
      slots=f"SELECT DISTINCT T2.name AS dept {PROF_DEPT}"),
    T("avg_salary_per_dept", f"SELECT T2.name, AVG(T1.salary) {PROF_DEPT} GROUP BY T2.name",
      "What is the average professor salary in each department?",
      "For each department, show the average salary of its professors."),
    T("courses_taught_by",
      "SELECT T1.title FROM courses AS T1 JOIN professors AS T2 ON T1.professor_id = T2.professor_id "
      "WHERE T2.name = '{prof}'",
      "Which courses does '{prof}' teach?",
      "List the titles of courses taught by the professor '{prof}'.",
      slots="SELECT DISTINCT T2.name AS prof FROM courses AS T1 JOIN professors AS T2 "
            "ON T1.professor_id = T2.professor_id"),
    T("courses_per_credits", "SELECT credits, COUNT(*) FROM courses GROUP BY credits",
      "How many courses are there for each number of credits?",
      "Count the courses per credit value."),
    T("largest_budgets", "SELECT name FROM departments ORDER BY budget DESC LIMIT 3",
      "Which three departments have the largest budgets?",
      "List the 3 departments with the highest budget."),
    # nesting, set operations, HAVING, several joins
    T("students_in_course", f"SELECT T1.name {STUDENT_COURSE} WHERE T3.title = '{{course}}'",
      "Which students are enrolled in '{course}'?",
      "List the names of students taking the course '{course}'.",
      slots=f"SELECT DISTINCT T3.title AS course {STUDENT_COURSE}"),
    T("not_enrolled_year",
      "SELECT name FROM students WHERE enrollment_year = {year} AND student_id NOT IN (SELECT student_id FROM "
      "enrollments)",
      "Which students who enrolled in {year} are not registered in any course?",
      "List the students with enrollment year {year} who have no enrollments.", slots=YEAR),
    T("dept_most_students", f"SELECT T2.name {STUDENT_DEPT} GROUP BY T1.department_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which department has the most students?",
      "What is the name of the department with the largest number of students?"),
    T("above_avg_salary", "SELECT name FROM professors WHERE salary > (SELECT AVG(salary) FROM professors)",
      "Which professors earn more than the average professor salary?",
      "List the professors whose salary is above average."),
    T("depts_having_courses", f"SELECT T2.name {COURSE_DEPT} GROUP BY T1.department_id HAVING COUNT(*) >= {{n}}",
      "Which departments offer at least {n} courses?",
      "List the departments with {n} or more courses.",
      slots="SELECT DISTINCT COUNT(*) AS n FROM courses GROUP BY department_id"),
    T("grade_in_semester",
      f"SELECT DISTINCT T1.name {STUDENT_ENROLL} WHERE T2.grade = '{{grade}}' AND T2.semester = '{{semester}}'",
      "Which students received the grade '{grade}' in '{semester}'?",
      "List the distinct students who got the grade '{grade}' during the semester '{semester}'.",
      slots="SELECT DISTINCT grade, semester FROM enrollments"),
    T("both_depts",
      f"SELECT T1.name {STUDENT_COURSE_DEPT} WHERE T4.name = '{{dept_a}}' INTERSECT "
      f"SELECT T1.name {STUDENT_COURSE_DEPT} WHERE T4.name = '{{dept_b}}'",
      "Which students took courses in both '{dept_a}' and '{dept_b}'?",
      "Find the students enrolled in courses of the '{dept_a}' department and also of the '{dept_b}' department.",
      slots="SELECT A.name AS dept_a, B.name AS dept_b FROM departments AS A "
            "JOIN departments AS B ON A.name < B.name"),
    T("budget_above_avg", "SELECT name FROM departments WHERE budget > (SELECT AVG(budget) FROM departments)",
      "Which departments have a budget above the average budget?",
      "List the departments whose budget exceeds the average."),
    T("profs_without_course",
      "SELECT name FROM professors WHERE professor_id NOT IN "
      "(SELECT professor_id FROM courses WHERE professor_id IS NOT NULL)",
      "Which professors do not teach any course?",
      "List the professors who have no courses."),
)

DOMAIN = Domain("university", TABLES, populate, TEMPLATES)
