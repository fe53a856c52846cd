"""Company HR: departments, employees (with managers), projects and project assignments."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import (
    ADJECTIVES, CITIES, FIRST_NAMES, LAST_NAMES, NOUNS, email_for, iso_date, maybe, skewed_choices,
)
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

DEPARTMENTS = (
    "Sales", "Marketing", "Finance", "Legal", "Engineering", "Support", "Research", "Operations",
    "Human Resources", "Procurement", "Logistics", "Quality", "Design", "Security", "Training",
    "Facilities", "Analytics", "Compliance", "Public Relations", "Customer Success",
)
JOB_TITLES = ("Analyst", "Engineer", "Manager", "Specialist", "Coordinator", "Director", "Intern")
ROLES = ("Lead", "Developer", "Reviewer", "Tester", "Advisor")

TABLES = (
    Table("departments", (
        ("department_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("location", "TEXT"),
    )),
    Table("employees", (
        ("employee_id", "INTEGER PRIMARY KEY"), ("first_name", "TEXT NOT NULL"), ("last_name", "TEXT NOT NULL"),
        ("department_id", "INTEGER"), ("job_title", "TEXT"), ("hire_date", "TEXT"), ("salary", "INTEGER"),
        ("manager_id", "INTEGER"), ("email", "TEXT"),
    ), (("department_id", "departments", "department_id"), ("manager_id", "employees", "employee_id"))),
    Table("projects", (
        ("project_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("department_id", "INTEGER"),
        ("start_date", "TEXT"), ("end_date", "TEXT"), ("budget", "INTEGER"),
    ), (("department_id", "departments", "department_id"),)),
    Table("assignments", (
        ("assignment_id", "INTEGER PRIMARY KEY"), ("employee_id", "INTEGER NOT NULL"),
        ("project_id", "INTEGER NOT NULL"), ("role", "TEXT"), ("hours", "INTEGER"),
    ), (("employee_id", "employees", "employee_id"), ("project_id", "projects", "project_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    departments = [(i, name, rng.choice(CITIES[:10])[0]) for i, name in enumerate(DEPARTMENTS, 1)]
    names = rng.sample([(f, l) for f in FIRST_NAMES for l in LAST_NAMES], 150)
    salaries = rng.sample(range(38000, 190000, 250), 150)  # distinct, so top earners are unambiguous
    employees = []
    for i, (first, last) in enumerate(names, 1):
        # the first 20 employees head the departments; everyone else reports to an earlier employee
        manager = None if i <= 6 else rng.randint(1, min(i - 1, 30))
        employees.append((i, first, last, (i - 1) % 20 + 1 if i <= 20 else rng.randint(1, 20),
                          "Director" if i <= 6 else rng.choice(JOB_TITLES[:-1] if i <= 30 else JOB_TITLES),
                          iso_date(rng, "2008-01-01", "2024-05-31"), salaries[i - 1], manager,
                          maybe(rng, email_for(f"{first} {last}", "corp.example"), 0.1)))
    project_names = rng.sample([f"Project {a} {n}" for a in ADJECTIVES for n in NOUNS], 40)
    projects = []
    owners = skewed_choices(rng, range(1, 21), 40)  # uneven, so one department runs the most projects
    for i, name in enumerate(project_names, 1):
        start = iso_date(rng, "2021-01-01", "2024-03-31")
        end = maybe(rng, iso_date(rng, start, "2024-12-31"), 0.35)
        projects.append((i, name, owners[i - 1], start, end, rng.randrange(20000, 900000, 5000)))
    employee_ids = skewed_choices(rng, range(1, 151), 200)
    project_ids = skewed_choices(rng, range(1, 41), 200)
    assignments = [(i, employee_ids[i - 1], project_ids[i - 1], rng.choice(ROLES), rng.randrange(10, 400, 10))
                   for i in range(1, 201)]
    return {"departments": departments, "employees": employees, "projects": projects, "assignments": assignments}


EMP_DEPT = "FROM employees AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id"
PROJ_DEPT = "FROM projects AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id"
EMP_ASSIGN = "FROM employees AS T1 JOIN assignments AS T2 ON T1.employee_id = T2.employee_id"
EMP_PROJ = EMP_ASSIGN + " JOIN projects AS T3 ON T2.project_id = T3.project_id"
MANAGER = "FROM employees AS T1 JOIN employees AS T2 ON T1.manager_id = T2.employee_id"
TITLE = "SELECT DISTINCT job_title FROM employees"

TEMPLATES = (
    # single table
    T("by_job_title", "SELECT first_name, last_name FROM employees WHERE job_title = '{job_title}'",
      "Which employees have the job title '{job_title}'?",
      "List the first and last names of every '{job_title}'.", slots=TITLE),
    T("count_last_name", "SELECT COUNT(*) FROM employees WHERE last_name = '{last_name}'",
      "How many employees have the last name '{last_name}'?",
      "Count the employees whose last name is '{last_name}'.", slots="SELECT DISTINCT last_name FROM employees"),
    T("salary_of", "SELECT salary FROM employees WHERE first_name = '{first}' AND last_name = '{last}'",
      "What is the salary of the employee with first name '{first}' and last name '{last}'?",
      "How much does the employee named '{first}' (first name) '{last}' (last name) earn?",
      slots="SELECT first_name AS first, last_name AS last FROM employees"),
    T("hired_after", "SELECT first_name, last_name FROM employees WHERE hire_date > '{date}'",
      "Which employees were hired after '{date}'?",
      "List the names of employees whose hire date is later than '{date}'.",
      slots="SELECT hire_date AS date FROM employees WHERE hire_date > '2021-06-30'"),
    T("avg_salary_title", "SELECT AVG(salary) FROM employees WHERE job_title = '{job_title}'",
      "What is the average salary of employees titled '{job_title}'?",
      "Find the mean salary of employees with the title '{job_title}'.", slots=TITLE),
    T("no_manager", "SELECT first_name, last_name FROM employees WHERE manager_id IS NULL",
      "Which employees have no manager?",
      "List the employees who do not report to anyone."),
    T("ongoing_projects", "SELECT name FROM projects WHERE end_date IS NULL",
      "Which projects have no end date yet?",
      "List the projects that are still ongoing (no end date)."),
    T("big_projects", "SELECT name FROM projects WHERE budget > {budget}",
      "Which projects have a budget over {budget}?",
      "List the projects with a budget above {budget}.", slots="SELECT budget FROM projects WHERE budget > 500000"),
    T("depts_in_location", "SELECT name FROM departments WHERE location = '{location}'",
      "Which departments are located in '{location}'?",
      "List the departments based in '{location}'.", slots="SELECT DISTINCT location FROM departments"),
    T("count_role", "SELECT COUNT(*) FROM assignments WHERE role = '{role}'",
      "How many assignments have the role '{role}'?",
      "Count the project assignments where the role is '{role}'.", slots="SELECT DISTINCT role FROM assignments"),
    T("projects_started_in", "SELECT name FROM projects WHERE start_date LIKE '{year}%'",
      "Which projects started in the year '{year}'?",
      "List the projects whose start date begins with '{year}'.",
      slots="SELECT DISTINCT substr(start_date, 1, 4) AS year FROM projects"),
    T("max_hours", "SELECT MAX(hours) FROM assignments WHERE role = '{role}'",
      "What is the largest number of hours on any assignment with role '{role}'?",
      "Find the maximum hours of any assignment with role '{role}'.", slots="SELECT DISTINCT role FROM assignments"),
    # one join, GROUP BY or ORDER BY
    T("employees_of_dept", f"SELECT T1.first_name, T1.last_name {EMP_DEPT} WHERE T2.name = '{{dept}}'",
      "Who works in the '{dept}' department?",
      "List the names of employees in '{dept}'.", slots=f"SELECT DISTINCT T2.name AS dept {EMP_DEPT}"),
    T("reports_of", f"SELECT T1.first_name, T1.last_name {MANAGER} WHERE T2.last_name = '{{last}}' AND T2.first_name "
                    f"= '{{first}}'",
      "Which employees report to the manager with first name '{first}' and last name '{last}'?",
      "List the direct reports of the manager whose first name is '{first}' and last name is '{last}'.",
      slots=f"SELECT DISTINCT T2.first_name AS first, T2.last_name AS last {MANAGER}"),
    T("headcount_per_title", "SELECT job_title, COUNT(*) FROM employees GROUP BY job_title",
      "How many employees hold each job title?",
      "Count the employees per job title."),
    T("top_earners", "SELECT first_name, last_name FROM employees ORDER BY salary DESC LIMIT 5",
      "Who are the five highest-paid employees?",
      "List the 5 employees with the largest salaries."),
    T("projects_of_dept", f"SELECT T1.name {PROJ_DEPT} WHERE T2.name = '{{dept}}'",
      "Which projects belong to the '{dept}' department?",
      "List the projects run by '{dept}'.", slots=f"SELECT DISTINCT T2.name AS dept {PROJ_DEPT}"),
    T("hours_per_project", "SELECT project_id, SUM(hours) FROM assignments GROUP BY project_id",
      "How many hours are assigned to each project id?",
      "Show the total assignment hours per project id."),
    T("newest_in_title", "SELECT first_name, last_name FROM employees WHERE job_title = '{job_title}' ORDER BY "
                         "hire_date DESC LIMIT 1",
      "Who is the most recently hired '{job_title}'?",
      "Which '{job_title}' has the latest hire date?", slots=TITLE),
    T("avg_salary_per_dept", f"SELECT T2.name, AVG(T1.salary) {EMP_DEPT} GROUP BY T2.name",
      "What is the average salary in each department?",
      "For each department, show the average employee salary."),
    # nesting, set operations, HAVING, several joins
    T("staff_on_project", f"SELECT T1.first_name, T1.last_name {EMP_PROJ} WHERE T3.name = '{{project}}'",
      "Which employees are assigned to '{project}'?",
      "List the names of employees working on '{project}'.", slots=f"SELECT DISTINCT T3.name AS project {EMP_PROJ}"),
    T("unassigned_in_dept",
      f"SELECT T1.first_name, T1.last_name {EMP_DEPT} WHERE T2.name = '{{dept}}' AND T1.employee_id NOT IN "
      "(SELECT employee_id FROM assignments)",
      "Which employees of '{dept}' are not assigned to any project?",
      "List the '{dept}' employees without project assignments.", slots=f"SELECT DISTINCT T2.name AS dept {EMP_DEPT}"),
    T("above_avg_in_title",
      "SELECT first_name, last_name FROM employees WHERE job_title = '{job_title}' AND salary > (SELECT AVG(salary) "
      "FROM employees)",
      "Which '{job_title}' employees earn more than the company average salary?",
      "List the employees titled '{job_title}' whose salary is above the average salary.", slots=TITLE),
    T("dept_most_projects", f"SELECT T2.name {PROJ_DEPT} GROUP BY T1.department_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which department runs the most projects?",
      "What is the department with the largest number of projects?"),
    T("titles_having", "SELECT job_title FROM employees GROUP BY job_title HAVING AVG(salary) > {salary}",
      "Which job titles have an average salary above {salary}?",
      "List the job titles whose employees earn more than {salary} on average.",
      slots="SELECT DISTINCT CAST(AVG(salary) AS INTEGER) - 1 AS salary FROM employees GROUP BY job_title"),
    T("two_roles",
      f"SELECT T1.last_name {EMP_ASSIGN} WHERE T2.role = '{{role1}}' INTERSECT "
      f"SELECT T1.last_name {EMP_ASSIGN} WHERE T2.role = '{{role2}}'",
      "What are the last names of employees who have been both '{role1}' and '{role2}' on projects?",
      "Find the last names of employees assigned with role '{role1}' and also with role '{role2}'.",
      slots="SELECT A.role AS role1, B.role AS role2 FROM (SELECT DISTINCT role FROM assignments) AS A "
            "JOIN (SELECT DISTINCT role FROM assignments) AS B ON A.role < B.role"),
    T("earns_more_than_manager",
      f"SELECT T1.first_name, T1.last_name {MANAGER} WHERE T1.salary > T2.salary AND T2.job_title = '{{job_title}}'",
      "Which employees earn more than their manager, where the manager has the job title '{job_title}'?",
      "List employees whose salary is higher than that of their '{job_title}' manager.",
      slots=f"SELECT DISTINCT T2.job_title AS job_title {MANAGER}"),
    T("projects_without_role",
      "SELECT name FROM projects EXCEPT SELECT T2.name FROM assignments AS T1 JOIN projects AS T2 "
      "ON T1.project_id = T2.project_id WHERE T1.role = '{role}'",
      "Which projects have nobody in the role '{role}'?",
      "List the projects without any '{role}' assignment.", slots="SELECT DISTINCT role FROM assignments"),
)

DOMAIN = Domain("company_hr", TABLES, populate, TEMPLATES)
